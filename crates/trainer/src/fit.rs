//! The training loop, step by step as the algorithm reads: the algorithm's step (rollout and
//! rewards, then its update), validation, checkpoint — each under a named timer. Launched as
//! several ranks (torchrun, Slurm, `flowtune launch`), every rank runs this same loop on its share
//! of each step; rank 0 alone writes metrics, pictures, checkpoints and the exported weights.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flowtune_config::{Finetune, Recipe, Resume, Sharding, StateOffload};
use flowtune_data::PromptDataset;
use flowtune_models::{Dtypes, FlowPipeline, PipelineOptions, RandomWeights};
use flowtune_objectives::Metrics;
use flowtune_rollout::Engine;
use tch::Device;

use crate::checkpoint::{self, LoopState};
use crate::dist::Comm;
use crate::logging::{metric_line, progress_bar, step_line, summary_line, MetricLog};
use crate::optim::{learning_rate, AdamW, Ema};
use crate::reference::Reference;
use crate::run::Run;
use crate::source::Source;
use crate::update::Learner;
use crate::validation::{validate, validation_sampler};
use crate::TrainError;

/// What a finished run leaves behind.
#[derive(Debug)]
pub struct TrainSummary {
    /// Metrics of each step run in this process.
    pub metrics: Vec<Metrics>,
    /// The exported weights: the LoRA (diffusers/PEFT layout) or, after full fine-tuning, the
    /// transformer's safetensors in a diffusers `transformer/` folder.
    pub export: PathBuf,
    pub steps_run: u64,
    /// This process's rank in a launched job (0 alone).
    pub rank: usize,
    /// Why the run stopped before `trainer.total_steps` at a signal, with its checkpoint saved.
    pub stopped: Option<String>,
}

/// How a run goes besides its recipe (`flowtune bench step` measures with these).
#[derive(Debug, Clone, Copy)]
pub struct TrainOptions {
    /// Seeded random weights and stand-in prompt embeddings instead of the checkpoint files.
    pub random_weights: Option<RandomWeights>,
    /// Checkpoints and the exported weights are written (off: a measurement leaves nothing).
    pub write: bool,
}

impl Default for TrainOptions {
    fn default() -> Self {
        Self { random_weights: None, write: true }
    }
}

/// How `recipe` loads its pipeline on `device`.
fn pipeline_options(recipe: &Recipe, device: Device) -> PipelineOptions {
    let m = &recipe.model;
    PipelineOptions {
        device,
        dtypes: Dtypes {
            transformer: m.dtype.kind(),
            text_encoders: m.frozen_dtype.kind(),
            vae: m.frozen_dtype.kind(),
        },
        lora: (m.finetune == Finetune::Lora).then(|| m.lora.clone()),
        max_sequence_length: Some(m.max_sequence_length),
        embedded_guidance: m.guidance,
        num_frames: m.num_frames,
        output_resolution: m.output_resolution,
        offload: m.offload,
        random: None,
    }
}

/// The checkpoint `trainer.resume` names, if any: under `auto` the newest whole one (rank 0
/// checks the files and says which it skips; the others take its choice).
fn resume_from(
    resume: &Resume,
    ckpt_root: &Path,
    comm: &Comm,
) -> Result<Option<PathBuf>, TrainError> {
    Ok(match resume {
        Resume::None => None,
        Resume::Auto => {
            let newest = match comm.is_main() {
                true => checkpoint::newest_whole(ckpt_root, |m| eprintln!("{m}"))?,
                false => None,
            };
            // Step + 1 (0: none), summed over the ranks: rank 0's choice.
            let chosen = comm.sum_f64(newest.map_or(0.0, |(step, _)| step as f64 + 1.0))?;
            (chosen > 0.0).then(|| ckpt_root.join(format!("step_{:06}", chosen as u64 - 1)))
        }
        Resume::Path(dir) => {
            if !dir.join("state.json").exists() {
                return Err(TrainError::Invalid(format!(
                    "trainer.resume: {} is not a complete checkpoint directory (no state.json); use auto, none or a checkpoints/step_NNNNNN directory",
                    dir.display()
                )));
            }
            if let Some(why) = crate::manifest::damage(dir) {
                return Err(TrainError::Invalid(format!(
                    "trainer.resume: {} is damaged: {why}; trainer.resume: auto takes the newest \
                     whole checkpoint",
                    dir.display()
                )));
            }
            Some(dir.clone())
        }
    })
}

/// Refuses to resume with a recipe that computes otherwise than the one the run folder's
/// checkpoints were trained with (its `recipe.resolved.yaml`), naming the keys, unless
/// `trainer.allow_recipe_change`.
fn check_recipe_unchanged(recipe: &Recipe, out_dir: &Path) -> Result<(), TrainError> {
    let path = out_dir.join(flowtune_config::RESOLVED);
    let Ok(text) = std::fs::read_to_string(&path) else { return Ok(()) };
    let earlier = Recipe::from_yaml(&text, &path.display().to_string(), &[])
        .map_err(|e| TrainError::Invalid(e.to_string()))?;
    let changes = recipe.math_changes(&earlier);
    if changes.is_empty() || recipe.trainer.allow_recipe_change {
        return Ok(());
    }
    Err(TrainError::Invalid(format!(
        "resuming with a recipe that changes what {} was trained with: {}; set \
         trainer.allow_recipe_change=true to go on with the change",
        path.display(),
        changes.join(", ")
    )))
}

/// The files and pipelines a recipe names, checked before anything loads; a missing one is named
/// by its key (with the folder a relative path is taken from).
fn check_inputs(recipe: &Recipe) -> Result<(), TrainError> {
    let whence = |path: &Path| match (path.is_relative(), std::env::current_dir()) {
        (true, Ok(cwd)) => format!(
            " (from the working directory {}; a relative path in a recipe file is taken from the \
             file's folder, one in an override from the working directory)",
            cwd.display()
        ),
        _ => String::new(),
    };
    let d = &recipe.data;
    let files = [("data.train_files", &d.train_files), ("data.val_files", &d.val_files)];
    let files = files.into_iter().chain([("data.preference_files", &d.preference_files)]);
    for (key, list) in files {
        if let Some((i, f)) = list.iter().enumerate().find(|(_, f)| !f.exists()) {
            let message = format!("{key}[{i}]: {} does not exist{}", f.display(), whence(f));
            return Err(TrainError::Invalid(message));
        }
    }
    let teachers = recipe.model.all_teachers().into_iter().enumerate();
    let pipelines = std::iter::once(("model.path".to_string(), recipe.model.path.clone()))
        .chain(teachers.map(|(i, t)| (format!("model.teachers[{i}].path"), t.path)));
    for (key, path) in pipelines {
        flowtune_models::pipeline::PipelineDir::open(&path)
            .map_err(|e| TrainError::Invalid(format!("{key}: {e}{}", whence(&path))))?;
    }
    Ok(())
}

/// How many prompt groups (or offline pairs) a step has: every rank needs at least one.
fn check_shares(recipe: &Recipe, comm: &Comm) -> Result<(), TrainError> {
    let (per_step, ranks) = (recipe.data.prompts_per_step, comm.groups());
    if ranks > 1 && per_step < ranks {
        return Err(TrainError::Invalid(format!(
            "data.prompts_per_step {per_step} is less than the {ranks} ranks of this job; every rank needs at least one prompt group per step"
        )));
    }
    if comm.shards_blocks(recipe) && per_step % ranks != 0 {
        return Err(TrainError::Invalid(format!(
            "data.prompts_per_step {per_step} does not divide by the {ranks} ranks of this job; trainer.sharding: {} gathers each block on all ranks together, so every rank must sample as many prompt groups",
            sharding_name(recipe)
        )));
    }
    if ranks > 1 && !recipe.data.drop_last {
        return Err(TrainError::Invalid(format!(
            "data.drop_last: false with {ranks} ranks: an epoch's last, short step could leave a rank without prompts; set data.drop_last: true"
        )));
    }
    Ok(())
}

/// `trainer.sharding` as the recipe would spell it.
fn sharding_name(recipe: &Recipe) -> String {
    serde_json::to_value(recipe.sharding())
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

/// Runs `recipe` on `device` until `trainer.total_steps`, resuming as `trainer.resume` says. In a
/// launched job (see [`Comm::from_env`]) it joins the other ranks first; a CUDA run then computes
/// on `cuda:LOCAL_RANK`.
pub fn train(recipe: &Recipe, device: Device) -> Result<TrainSummary, TrainError> {
    train_with(recipe, device, TrainOptions::default())
}

/// [`train`] with `options`.
pub fn train_with(
    recipe: &Recipe,
    device: Device,
    options: TrainOptions,
) -> Result<TrainSummary, TrainError> {
    let registered = flowtune_objectives::algorithm(&recipe.algorithm)?;
    let mut algorithm = crate::algorithms::for_objective(registered.objective);
    let t = &recipe.trainer;
    let timeout = Duration::from_secs_f64(t.dist_timeout_s);
    let comm = Comm::from_env(device, timeout, t.sequence_parallel_size)?;
    check_shares(recipe, &comm)?;
    check_inputs(recipe)?;
    let device = comm.device();
    let validating = t.val_freq > 0 || t.val_before_train;
    if validating {
        validation_sampler(recipe).validate().map_err(|e| {
            TrainError::Invalid(format!(
                "validation sampler (rollout.eval_steps {}): {e}",
                recipe.rollout.eval_steps
            ))
        })?;
    }
    let out_dir = &t.output_dir;
    let ckpt_root = out_dir.join("checkpoints");

    let write = options.write;
    let options =
        PipelineOptions { random: options.random_weights, ..pipeline_options(recipe, device) };
    // Sharded blocks are read as this rank's slices only, never whole.
    let load = || flowtune_models::load_pipeline(&recipe.model.path, &options);
    let (loaded, rss_before) = (Instant::now(), crate::perf::status_bytes("VmRSS:"));
    let mut pipe = match comm.shards_blocks(recipe) {
        true => flowtune_models::shard_load::with_deferred_blocks(load)?,
        false => load()?,
    };
    let latent_shape = pipe
        .latent_shape(recipe.model.resolution, recipe.model.resolution)
        .map_err(|e| TrainError::Invalid(format!("model.resolution {e}")))?;
    algorithm.load(recipe, &options, pipe.as_ref())?;
    // The run folder appears once the recipe is known to run here.
    std::fs::create_dir_all(out_dir).map_err(|e| TrainError::io(out_dir, e))?;
    let mut source = Source::for_recipe(recipe)?;
    let scorers = flowtune_rewards::build(&recipe.reward)?;
    let mut val_records = vec![];
    for f in &recipe.data.val_files {
        val_records.extend(PromptDataset::load(f)?.records);
    }
    if validating && val_records.is_empty() {
        return Err(TrainError::Invalid(
            "trainer.val_freq > 0 and trainer.val_before_train need prompts in data.val_files"
                .into(),
        ));
    }

    pipe.denoiser().set_gradient_checkpointing(t.gradient_checkpointing);
    let reference =
        Reference::for_recipe(recipe, pipe.as_ref(), algorithm.needs_reference(recipe))?;
    comm.shard_blocks(recipe, pipe.denoiser(), reference.as_ref())?;
    eprintln!("{}", crate::perf::load_line(device, loaded.elapsed().as_secs_f64(), rss_before));
    let sharded = pipe.denoiser().sharded_bytes();
    let params = pipe.denoiser().trainable_parameters();
    // `trainer.offload`: the optimizer's state and the weight copies in host memory.
    let host = t.offload != StateOffload::None;
    let ema = t.ema_decay.map(|d| Ema::new(d, &params, host));
    algorithm.start(&params, host);
    let mut optimizer = AdamW::new(params, t.betas, t.eps, t.weight_decay, host);
    if let Some(blocks) = pipe.denoiser().sharded().filter(|s| s.trains()) {
        optimizer.local = blocks.masters().into_keys().collect();
    }
    if recipe.sharding() == Sharding::Optimizer && comm.size() > 1 {
        // Each rank keeps its share of the Adam moments only (ZeRO-1).
        optimizer.shard(comm.rank(), comm.size());
    }
    if t.f32_master_weights {
        optimizer.keep_f32_masters();
    }
    let mut learner = Learner { ema, optimizer };
    let mut start = 0;
    let mut saved_line = serde_json::Value::Null;
    if let Some(dir) = resume_from(&t.resume, &ckpt_root, &comm)? {
        let state =
            checkpoint::load(&dir, pipe.denoiser_mut(), &mut learner, &algorithm.shadows())?;
        algorithm.restore(&state.algorithm)?;
        source.loader().state = state.loader;
        start = state.step;
        saved_line = state.metrics;
        if comm.is_main() {
            eprintln!("resumed from {} (step {start})", dir.display());
        }
    }
    if start > 0 {
        check_recipe_unchanged(recipe, out_dir)?;
    }
    // Later checkpoints would be the future of another run: kept aside, never deleted.
    if comm.is_main() && write {
        checkpoint::set_aside_after(&ckpt_root, start, |m| eprintln!("{m}"))?;
        let resolved = out_dir.join(flowtune_config::RESOLVED);
        std::fs::write(&resolved, recipe.to_yaml()).map_err(|e| TrainError::io(&resolved, e))?;
    }
    comm.barrier()?;

    let bar = progress_bar(t.total_steps, start);
    if !comm.is_main() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let world = comm.size();
    let run = Run {
        recipe,
        engine: Engine::new(pipe.as_ref(), &recipe.rollout, latent_shape, recipe.seed)?,
        reference,
        scorers,
        bar,
        comm,
    };
    let comm = &run.comm;
    let mut log =
        if comm.is_main() { Some(MetricLog::open(out_dir, start, &saved_line)?) } else { None };
    // SIGTERM, SIGUSR1 and Ctrl-C finish the current step, save a checkpoint and return.
    let stop_request = crate::signals::StopRequest::listen(comm.is_main());
    let mut all = vec![];
    let (mut last, mut stopped) = (start, None);
    if t.val_before_train && start == 0 {
        run.status("validation");
        let timer = Instant::now();
        let mut m = validate(&run, &val_records, 0)?;
        m.insert("timing_s/testing".into(), timer.elapsed().as_secs_f64());
        if let Some(log) = log.as_mut() {
            log.log(0, &m)?;
            run.say(format!("validation before training: {}", summary_line(&m)));
        }
    }
    let training = Instant::now();
    for k in start + 1..=t.total_steps {
        let step_start = Instant::now();
        let perf = crate::perf::start_step(device);
        let mut m = Metrics::new();
        let lr = learning_rate(t.lr_schedule, t.lr, k - 1, t.warmup_steps, t.total_steps);
        run.status("rollout + reward");
        let samples = algorithm.step(&run, &mut learner, &mut source, k, lr, &mut m)?;
        m.insert("actor/lr".into(), lr);

        // Every rank stops at the same step: when any of them is out of time or interrupted.
        let out_of_time =
            comm.any(t.time_limit_s.is_some_and(|l| training.elapsed().as_secs_f64() >= l))?;
        let last_step = k == t.total_steps || out_of_time;

        // testing
        if t.val_freq > 0 && (k.is_multiple_of(t.val_freq) || last_step) {
            run.status("validation");
            let timer = Instant::now();
            // Validation sees the EMA weights when there are some.
            let params = &learner.optimizer.params;
            let scores = match learner.ema.as_mut() {
                Some(ema) => ema.with_swapped(params, || validate(&run, &val_records, k)),
                None => validate(&run, &val_records, k),
            };
            m.extend(scores?);
            m.insert("timing_s/testing".into(), timer.elapsed().as_secs_f64());
        }

        // checkpoint
        let timer = Instant::now();
        let stop = comm.any(stop_request.received().is_some())?;
        let due = (t.save_freq > 0 && k.is_multiple_of(t.save_freq)) || last_step || stop;
        if due && write {
            let state = LoopState {
                step: k,
                loader: source.loader().state,
                optimizer_steps: learner.optimizer.steps,
                metrics: metric_line(k, &m),
                algorithm: algorithm.state(),
            };
            let kept = algorithm.shadows();
            checkpoint::save(
                &ckpt_root,
                pipe.denoiser(),
                &learner,
                &kept,
                &state,
                t.keep_last,
                comm,
            )?;
        }
        m.insert("timing_s/save_checkpoint".into(), timer.elapsed().as_secs_f64());
        let elapsed = step_start.elapsed().as_secs_f64();
        m.insert("timing_s/step".into(), elapsed);
        // Images per second per rank (per GPU; a sequence-parallel group shares its samples).
        let per_rank = samples as f64 / comm.sequence_size() as f64;
        m.insert("perf/throughput".into(), per_rank / elapsed);
        let kind = recipe.model.dtype.kind();
        crate::perf::step_metrics(&perf, elapsed, t.peak_tflops, kind, &mut m);
        m.insert("dist/world_size".into(), world as f64);
        m.insert("dist/sequence_parallel_size".into(), comm.sequence_size() as f64);
        if let Some((kept, block)) = sharded {
            m.insert("dist/sharded_weights_gb".into(), kept as f64 / (1u64 << 30) as f64);
            m.insert("dist/gathered_block_gb".into(), block as f64 / (1u64 << 30) as f64);
        }

        if let Some(log) = log.as_mut() {
            log.log(k, &m)?;
        }
        run.bar.inc(1);
        run.say(step_line(k, t.total_steps, &m, elapsed));
        if m.contains_key("timing_s/testing") {
            run.say(format!("validation at step {k}: {}", summary_line(&m)));
        }
        all.push(m);
        last = k;
        if stop {
            let by = stop_request.received().map_or("another rank's signal", crate::signals::name);
            stopped = Some(format!(
                "stopped by {by} after step {k}, with a checkpoint saved for it; rerun with \
                 trainer.resume: auto to continue"
            ));
            break;
        }
        if out_of_time && k < t.total_steps {
            run.say(format!("trainer.time_limit_s reached after step {k}; stopping"));
            break;
        }
    }
    run.bar.finish_and_clear();
    let main = comm.is_main();
    if !write {
        comm.barrier()?;
        let export = PathBuf::new();
        return Ok(TrainSummary {
            metrics: all,
            export,
            steps_run: last - start,
            rank: comm.rank(),
            stopped,
        });
    }
    let export = export_weights(pipe.as_ref(), out_dir, false, main)?;
    if let Some(ema) = learner.ema.as_mut() {
        ema.with_swapped(&learner.optimizer.params, || {
            export_weights(pipe.as_ref(), out_dir, true, main)
        })?;
    }
    // The other ranks return once the exported weights are on disk.
    comm.barrier()?;
    let steps_run = last - start;
    Ok(TrainSummary { metrics: all, export, steps_run, rank: comm.rank(), stopped })
}

/// Writes the trained weights for use outside flowtune: the LoRA in the diffusers/PEFT layout
/// (`lora/pytorch_lora_weights.safetensors`), or after full fine-tuning a diffusers
/// `transformer/` folder to put in place of the pipeline's. `ema` names the EMA variant. Only the
/// writing rank (`write`) writes; every rank calls it (sharded blocks are gathered) and returns
/// the path.
fn export_weights(
    pipe: &dyn FlowPipeline,
    out_dir: &Path,
    ema: bool,
    write: bool,
) -> Result<PathBuf, TrainError> {
    let model = pipe.denoiser();
    let lora = model.adapters().is_some();
    let (dir, file) = match (lora, ema) {
        (true, false) => (out_dir.join("lora"), "pytorch_lora_weights.safetensors"),
        (true, true) => (out_dir.join("lora"), "ema_lora_weights.safetensors"),
        (false, false) => (out_dir.join("transformer"), "diffusion_pytorch_model.safetensors"),
        (false, true) => (out_dir.join("ema_transformer"), "diffusion_pytorch_model.safetensors"),
    };
    let path = dir.join(file);
    // Trained sharded blocks are gathered from every rank, one block at a time.
    let gathered = !lora && model.sharded().is_some();
    if !write && !gathered {
        return Ok(path);
    }
    if write {
        std::fs::create_dir_all(&dir).map_err(|e| TrainError::io(&dir, e))?;
    }
    if lora {
        model.save_lora(&path)?;
        return Ok(path);
    }
    model.write_weights(write.then_some(path.as_path()))?;
    if write {
        let config = pipe.denoiser_dir().join("config.json");
        let copied = std::fs::copy(&config, dir.join("config.json"));
        copied.map_err(|e| TrainError::io(&config, e))?;
    }
    Ok(path)
}
