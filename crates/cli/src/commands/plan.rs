//! `flowtune plan RECIPE [KEY=VALUE…] [--gpus N] [--gpu-memory GiB] [--json]`: what a training
//! step holds per rank, from the pipeline's configs alone, and whether it fits.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;

use clap::Args;
use flowtune_config::{Finetune, Offload, Recipe, Sharding, StateOffload};
use flowtune_models::Dtype;
use flowtune_plan::{plan, verdict, Patterns, Pipeline, Place, Setup, GIB};
use flowtune_rewards::{JudgeBackend, JudgeMode};

use crate::Failure;

#[derive(Args)]
pub struct PlanArgs {
    /// A YAML recipe; its `model.path` may hold only `model_index.json` and each component's
    /// `config.json`.
    recipe: PathBuf,
    /// Overrides like `model.offload=encoders`.
    overrides: Vec<String>,
    /// Data-parallel ranks (default: `WORLD_SIZE`, else 1).
    #[arg(long)]
    gpus: Option<u64>,
    /// Memory of one GPU in GiB.
    #[arg(long, default_value_t = 80.0)]
    gpu_memory: f64,
    /// Machine-readable output (with a boolean `fits`).
    #[arg(long)]
    json: bool,
    /// Activation constants measured by `scripts/measure_activation_constants.py --json` (on the
    /// GPU that will train) in place of the built-in ones.
    #[arg(long)]
    constants: Option<PathBuf>,
}

/// The constants of a `measure_activation_constants.py --json` file: block name → (bf16, f32).
pub(crate) fn read_constants(path: &Path) -> anyhow::Result<BTreeMap<String, (f64, f64)>> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| path.display().to_string())?;
    let blocks = v["constants"].as_object().ok_or_else(|| {
        anyhow::anyhow!("{}: expected {{\"constants\": {{block: {{bf16, f32}}}}}}", path.display())
    })?;
    blocks
        .iter()
        .map(|(name, c)| match (c["bf16"].as_f64(), c["f32"].as_f64()) {
            (Some(b), Some(f)) if b > 0.0 && f > 0.0 => Ok((name.clone(), (b, f))),
            _ => Err(anyhow::anyhow!(
                "{}: constants.{name}: expected positive `bf16` and `f32` numbers",
                path.display()
            )),
        })
        .collect()
}

pub fn run(args: PlanArgs) -> Result<(), Failure> {
    let mut recipe = Recipe::load(&args.recipe, &args.overrides).map_err(Failure::input)?;
    let gpus = match args.gpus {
        Some(n) => n,
        None => std::env::var("WORLD_SIZE").ok().and_then(|w| w.parse().ok()).unwrap_or(1),
    };
    if gpus == 0 || !(args.gpu_memory > 0.0 && args.gpu_memory.is_finite()) {
        return Err(Failure::input(anyhow::anyhow!("--gpus must be ≥ 1 and --gpu-memory > 0 GiB")));
    }
    if recipe.model.path.as_os_str().is_empty() {
        return Err(Failure::input(anyhow::anyhow!(
            "{}: model.path is not set; point it at a pipeline directory (configs are enough)",
            args.recipe.display()
        )));
    }
    let memory = (args.gpu_memory, "per GPU (--gpu-memory)");
    if let Some(line) = super::auto_sizes::fit(&mut recipe, gpus, memory.0, memory.1)? {
        eprintln!("{line}");
    }
    let (dir, mut pipe) = read_model(&recipe)?;
    if let Some(path) = &args.constants {
        pipe.use_constants(&read_constants(path).map_err(Failure::input)?);
    }
    let sp = recipe.trainer.sequence_parallel_size as u64;
    if gpus % sp != 0 {
        return Err(Failure::input(anyhow::anyhow!(
            "trainer.sequence_parallel_size {sp} does not divide --gpus {gpus}"
        )));
    }
    let setup = setup(&recipe, &pipe, gpus, args.gpu_memory).map_err(Failure::input)?;
    let p = plan(&pipe, &setup);
    let v = verdict(&pipe, &setup);
    // A split job's rollout ranks: whole weights, the frozen parts, the rollout.
    let rollout = (setup.rollout_ranks > 0).then(|| {
        let side = setup.rollout_rank();
        (plan(&pipe, &side), verdict(&pipe, &side))
    });
    let json_items = |p: &flowtune_plan::Plan| -> Vec<serde_json::Value> {
        p.items
            .iter()
            .map(|i| {
                serde_json::json!({"item": i.item, "dtype": i.dtype, "bytes": i.bytes,
                    "gib": i.bytes as f64 / GIB, "place": i.place})
            })
            .collect()
    };
    if args.json {
        let items = json_items(&p);
        let rollout_rank = rollout.as_ref().map(|(p, v)| {
            serde_json::json!({"ranks": setup.rollout_ranks, "items": json_items(p),
                "device_gib": p.device_bytes as f64 / GIB, "host_gib": p.host_bytes as f64 / GIB,
                "load_gib": p.load_bytes as f64 / GIB, "fits": v.fits, "verdict": v.message})
        });
        let out = serde_json::json!({
            "recipe": args.recipe, "pipeline": pipe.class, "model_path": dir,
            "gpus": gpus, "gpu_memory_gib": args.gpu_memory, "sequence_parallel_size": sp,
            "denoiser_params": p.denoiser_params, "lora_params": p.lora_params,
            "tokens": p.tokens, "sequences": p.sequences, "items": items,
            "device_gib": p.device_bytes as f64 / GIB, "host_gib": p.host_bytes as f64 / GIB,
            "load_gib": p.load_bytes as f64 / GIB,
            "fits": v.fits, "budget_gib": v.budget_gib, "changes": v.changes,
            "changed_gib": v.changed_gib, "verdict": v.message,
            "training_ranks": setup.gpus, "rollout_rank": rollout_rank,
        });
        println!("{}", serde_json::to_string_pretty(&out).expect("JSON"));
        return Ok(());
    }
    let mode = if setup.full {
        format!("full fine-tuning ({} params)", p.denoiser_params)
    } else {
        let pattern =
            if recipe.model.lora.rank_pattern.is_empty() { "" } else { " + rank_pattern" };
        format!("LoRA r{}{pattern} ({} params)", setup.lora_rank, p.lora_params)
    };
    let groups = if sp > 1 { format!(" in groups of {sp} (sequence parallel)") } else { "".into() };
    let k = setup.rollout_ranks;
    let who = if k > 0 {
        format!("per training rank ({} of them):", setup.gpus)
    } else {
        "per rank:".into()
    };
    println!(
        "{} ({}): {mode}, {} GPU(s) of {} GiB{groups}; {who}",
        pipe.class,
        dir.display(),
        gpus,
        args.gpu_memory
    );
    print_plan(&p, &v.message);
    if let Some((p, v)) = &rollout {
        println!("per rollout rank ({k} of them; trainer.rollout_ranks):");
        print_plan(p, &v.message);
    }
    Ok(())
}

/// The items of `p`, its totals and its verdict.
fn print_plan(p: &flowtune_plan::Plan, verdict: &str) {
    println!("{:<58} {:>5} {:>8}  where", "item", "dtype", "GiB");
    for i in &p.items {
        let place = if i.place == Place::Device { "device" } else { "host" };
        println!("{:<58} {:>5} {:>8.2}  {place}", i.item, i.dtype, i.bytes as f64 / GIB);
    }
    println!("{:<58} {:>5} {:>8.2}", "device total", "", p.device_bytes as f64 / GIB);
    println!("{:<58} {:>5} {:>8.2}", "host total (offloaded)", "", p.host_bytes as f64 / GIB);
    if p.load_bytes > p.device_bytes {
        let what = "loading peak";
        println!("{:<58} {:>5} {:>8.2}", what, "", p.load_bytes as f64 / GIB);
    }
    println!("verdict: {verdict}");
}

/// The configs of `model.path`: a Hub id reads them from the local Hugging Face cache, as
/// training does. The error names the key.
pub(crate) fn read_model(recipe: &Recipe) -> Result<(std::path::PathBuf, Pipeline), Failure> {
    let named = |e: &dyn std::fmt::Display| Failure::input(anyhow::anyhow!("model.path: {e}"));
    let dir = flowtune_models::hub::resolve(&recipe.model.path).map_err(|e| named(&e))?;
    let pipe = Pipeline::read(&dir).map_err(|e| named(&e))?;
    Ok((dir, pipe))
}

/// Refuses, before anything loads, a recipe that the plan says does not fit `gpus` GPUs of
/// `gpu_memory_gib` each (its step or its loading peak): the verdict names the change that fits.
/// `trainer.memory_check: false` skips it.
pub(crate) fn check_fits(
    recipe: &Recipe,
    gpus: u64,
    gpu_memory_gib: f64,
    what: &str,
) -> Result<(), Failure> {
    let (_, pipe) = read_model(recipe)?;
    let setup = setup(recipe, &pipe, gpus, gpu_memory_gib).map_err(Failure::input)?;
    // A split job's training ranks, then its rollout ranks.
    let sides = std::iter::once(("", setup.clone()))
        .chain((setup.rollout_ranks > 0).then(|| (" (a rollout rank)", setup.rollout_rank())));
    for (rank, setup) in sides {
        let v = verdict(&pipe, &setup);
        if !v.fits {
            return Err(Failure::input(anyhow::anyhow!(
                "this recipe does not fit {gpus} GPU(s) with {gpu_memory_gib:.1} GiB {what} by flowtune plan{rank}: {}; \
                 trainer.memory_check=false runs it anyway",
                v.message
            )));
        }
    }
    Ok(())
}

/// The planner's view of a recipe on `gpus` ranks; a LoRA pattern key that names no adapted
/// layer is refused, as the model refuses it.
pub(crate) fn setup(
    recipe: &Recipe,
    pipe: &Pipeline,
    gpus: u64,
    gpu_memory_gib: f64,
) -> anyhow::Result<Setup> {
    let dtype = |d: Dtype| match d {
        Dtype::F32 => flowtune_plan::Dtype::F32,
        Dtype::Bf16 => flowtune_plan::Dtype::Bf16,
        Dtype::F16 => flowtune_plan::Dtype::F16,
    };
    let (m, t, r) = (&recipe.model, &recipe.trainer, &recipe.rollout);
    // As the trainer reads the algorithm's needs (GARDO's KL anchor is an old-policy copy).
    let needs = flowtune_objectives::algorithm(&recipe.algorithm)?.needs;
    let reference = needs.keeps_reference(recipe.actor.use_kl_loss);
    let old_policy = needs.old_policy;
    let split = t.rollout_ranks as u64;
    if split >= gpus {
        anyhow::bail!("trainer.rollout_ranks {split} leaves no training rank among {gpus} GPU(s)");
    }
    m.lora.validate()?;
    let model_dir = flowtune_models::hub::resolve(&m.path)?;
    let condition = super::plan_pictures::largest(recipe, &model_dir)?;
    let ranks = m.lora.rank_pattern.iter().map(|(k, &r)| (k, r as u64));
    let setup = Setup {
        full: m.finetune == Finetune::Full,
        dtype: dtype(m.dtype),
        frozen_dtype: dtype(m.frozen_dtype),
        lora_rank: m.lora.rank.max(0) as u64,
        lora_targets: m.lora.target_modules.clone(),
        lora_rank_pattern: Patterns::new(ranks).map_err(anyhow::Error::msg)?,
        offload: match m.offload {
            Offload::None => flowtune_plan::Offload::None,
            Offload::Encoders => flowtune_plan::Offload::Encoders,
            Offload::EncodersAndVae => flowtune_plan::Offload::EncodersAndVae,
        },
        resolution: m.resolution.max(0) as u64,
        num_frames: m.num_frames.map(|f| f as u64),
        frame_rate: m.frame_rate,
        text_tokens: m.max_sequence_length as u64,
        condition_pictures: condition.encoded.iter().map(|&(w, h)| (w as u64, h as u64)).collect(),
        condition_text_tokens: if condition.cut_at_max_sequence_length {
            0
        } else {
            condition.text_tokens
        },
        micro_batch: t.micro_batch_size as u64,
        rollout_batch: r.batch_size as u64,
        gradient_checkpointing: t.gradient_checkpointing,
        f32_master_weights: t.f32_master_weights,
        sharding: match recipe.sharding() {
            Sharding::None => flowtune_plan::Sharding::None,
            Sharding::Optimizer => flowtune_plan::Sharding::Optimizer,
            Sharding::Frozen => flowtune_plan::Sharding::Frozen,
            Sharding::Full => flowtune_plan::Sharding::Full,
        },
        exact_gradient_sum: t.exact_gradient_sum,
        teachers: teachers(recipe, pipe)?,
        judges: judges(recipe)?,
        state_offload: match t.offload {
            StateOffload::None => flowtune_plan::StateOffload::None,
            StateOffload::Optimizer => flowtune_plan::StateOffload::Optimizer,
            StateOffload::All => flowtune_plan::StateOffload::All,
        },
        // As each family's diffusers pipeline decides (`Denoiser::runs_cfg`): Z-Image for every
        // scale above 0, a step-distilled FLUX.2 [klein] never, the others above 1.
        cfg: !pipe.distilled
            && r.guidance_scale > if pipe.class == "ZImagePipeline" { 0.0 } else { 1.0 },
        reference_copy: reference,
        // A second trained adapter set (DMD2's fake score) adds its two Adam moments to its copy.
        weight_copies: u64::from(t.ema_decay.is_some())
            + u64::from(old_policy)
            + 2 * u64::from(needs.adapters)
            + t.off_policy_lag,
        prompts_per_step: recipe.data.prompts_per_step as u64,
        samples_per_prompt: r.n as u64,
        window_steps: if r.sde_window_size > 0 {
            r.sde_window_size
        } else {
            r.steps.saturating_sub(1)
        } as u64,
        // Under `trainer.rollout_ranks` the first ranks only sample: `gpus` are the others.
        gpus: gpus - split,
        gpu_memory_gib,
        sequence_parallel: t.sequence_parallel_size as u64,
        rollout_ranks: split,
        samples_only: false,
    };
    for (_, den) in pipe.denoisers.iter().filter(|_| !setup.full) {
        let adapted: Vec<String> =
            den.inventory.names().filter(|n| setup.lora_rank_of(n).is_some()).collect();
        m.lora.check_patterns_used("model.lora.", &adapted).map_err(anyhow::Error::msg)?;
    }
    Ok(setup)
}

/// The reward models that run in this process (`vlm_judge` with `backend: native`, `hpsv3`),
/// read from their configs, in the dtype they will load in on a GPU.
fn judges(recipe: &Recipe) -> anyhow::Result<Vec<flowtune_plan::judges::Judge>> {
    let mut out = vec![];
    for (i, f) in recipe.reward.functions.iter().enumerate() {
        let native = f.vlm.as_ref().filter(|v| v.backend == JudgeBackend::Native);
        // (setting, model, dtype, offload, batch, answer tokens, preference model)
        let (key, model, dtype, offload, batch, answer, preference) = match (native, &f.hpsv3) {
            (Some(v), _) => {
                let answer = match v.mode {
                    JudgeMode::Expectation => 1,
                    _ => u64::from(v.max_tokens),
                };
                ("vlm", &v.model, &v.dtype, v.offload, v.batch_size, answer, false)
            }
            (None, Some(h)) => ("hpsv3", &h.model, &h.dtype, false, h.batch_size, 0, true),
            (None, None) => continue,
        };
        let key = format!("reward.functions[{i}].{key}.model");
        let dir = flowtune_models::hub::resolve(std::path::Path::new(model))
            .map_err(|e| anyhow::anyhow!("{key}: {e}"))?;
        let dtype = match dtype.as_deref() {
            None => None,
            Some("bfloat16" | "bf16") => Some(flowtune_plan::Dtype::Bf16),
            Some("float16" | "fp16" | "half") => Some(flowtune_plan::Dtype::F16),
            Some(_) => Some(flowtune_plan::Dtype::F32),
        };
        let side = recipe.model.resolution.max(0) as u64;
        let judge = flowtune_plan::judges::Judge::read(
            &dir,
            preference,
            dtype,
            offload,
            batch as u64,
            side,
            answer,
        )
        .map_err(|e| anyhow::anyhow!("{key}: {e}"))?;
        out.push(judge);
    }
    Ok(out)
}

/// The teacher pipelines of on-policy distillation, read from their configs; one whose folder
/// is not there (yet) is planned as the student's pipeline, and said so.
fn teachers(recipe: &Recipe, student: &Pipeline) -> anyhow::Result<Vec<Pipeline>> {
    let mut out = vec![];
    for teacher in recipe.model.all_teachers() {
        let dir = flowtune_models::hub::resolve(&teacher.path);
        match dir.ok().filter(|d| d.join("model_index.json").exists()) {
            Some(dir) => out.push(Pipeline::read(&dir)?),
            None => {
                eprintln!(
                    "plan: teacher {} not found; planned as the student's pipeline",
                    teacher.path.display()
                );
                out.push(student.clone());
            }
        }
    }
    Ok(out)
}
