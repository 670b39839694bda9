//! The training loop, step by step as the algorithm reads: collect (rollout + rewards), then the
//! algorithm's own half of the step (policy gradient, DPO or NFT), validation, checkpoint.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use flowtune_config::{Finetune, Recipe};
use flowtune_data::{PromptDataset, PromptLoader};
use flowtune_models::sd3::{Dtypes, Sd3Pipeline};
use flowtune_objectives::{Metrics, Objective};
use tch::{Device, Kind};

use crate::checkpoint::{self, LoopState};
use crate::collect::collect;
use crate::engine::Engine;
use crate::optim::{learning_rate, AdamW, Ema};
use crate::preference::PairSource;
use crate::reference::Reference;
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
}

/// What every step reads: the recipe, the rollout engine (and through it the pipeline), the
/// reference policy when the algorithm has one.
pub(crate) struct Run<'a> {
    pub recipe: &'a Recipe,
    pub engine: Engine<'a>,
    pub reference: Option<Reference>,
}

/// Where a step's training data comes from.
enum Source {
    /// Prompts, sampled `rollout.n` times each and scored.
    Prompts(PromptLoader),
    /// Offline preference pairs (DPO).
    Pairs(PairSource),
}

impl Source {
    fn loader(&mut self) -> &mut PromptLoader {
        match self {
            Self::Prompts(l) => l,
            Self::Pairs(p) => &mut p.loader,
        }
    }
}

fn kind_of(name: &str) -> Result<Kind, TrainError> {
    match name {
        "f32" => Ok(Kind::Float),
        "bf16" => Ok(Kind::BFloat16),
        "f16" => Ok(Kind::Half),
        other => {
            Err(TrainError::Invalid(format!("model.dtype `{other}`: expected f32, bf16 or f16")))
        }
    }
}

/// The step's data source: offline pairs for DPO with `data.preference_files`, else prompts.
fn source(recipe: &Recipe) -> Result<Source, TrainError> {
    let d = &recipe.data;
    if !d.preference_files.is_empty() {
        let mut pairs = vec![];
        for f in &d.preference_files {
            pairs.extend(flowtune_data::load_pairs(f)?);
        }
        let prompts = flowtune_data::pair_prompts(&pairs);
        let mut loader = PromptLoader::new(prompts, d.prompts_per_step, 1, recipe.seed)?;
        loader.shuffle = d.shuffle;
        loader.drop_last = d.drop_last;
        return Ok(Source::Pairs(PairSource::new(pairs, loader)));
    }
    if d.train_files.is_empty() {
        return Err(TrainError::Invalid(
            "data.train_files is empty; give at least one prompt file".into(),
        ));
    }
    let mut records = vec![];
    for f in &d.train_files {
        records.extend(PromptDataset::load(f)?.records);
    }
    let mut loader = PromptLoader::new(
        PromptDataset { records },
        d.prompts_per_step,
        recipe.rollout.n,
        recipe.seed,
    )?;
    loader.shuffle = d.shuffle;
    loader.drop_last = d.drop_last;
    Ok(Source::Prompts(loader))
}

/// Runs `recipe` on `device` until `trainer.total_steps`, resuming as `trainer.resume` says.
pub fn train(recipe: &Recipe, device: Device) -> Result<TrainSummary, TrainError> {
    let algorithm = flowtune_objectives::algorithm(&recipe.algorithm)?;
    let t = &recipe.trainer;
    let val_sampler = validation_sampler(recipe);
    let validating = t.val_freq > 0 || t.val_before_train;
    if validating {
        val_sampler.validate().map_err(|e| {
            TrainError::Invalid(format!(
                "validation sampler (rollout.eval_steps {}): {e}",
                recipe.rollout.eval_steps
            ))
        })?;
    }
    let out_dir = &t.output_dir;
    std::fs::create_dir_all(out_dir)
        .map_err(|e| TrainError::Io(format!("{}: {e}", out_dir.display())))?;
    let ckpt_root = out_dir.join("checkpoints");

    let dtypes = Dtypes {
        transformer: kind_of(&recipe.model.dtype)?,
        text_encoders: kind_of(&recipe.model.frozen_dtype)?,
        vae: kind_of(&recipe.model.frozen_dtype)?,
    };
    let finetune = recipe.model.finetune;
    let lora = (finetune == Finetune::Lora).then_some(&recipe.model.lora);
    let mut pipe = Sd3Pipeline::load(&recipe.model.path, device, dtypes, lora)?;
    pipe.t5_max_length = recipe.model.max_sequence_length;

    let mut source = source(recipe)?;
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

    let params = match &pipe.transformer.adapters {
        Some(adapters) => adapters.store.variables().into_iter().collect(),
        None => pipe.transformer.full_parameters(),
    };
    let objective = algorithm.objective;
    let needs_reference = recipe.actor.use_kl_loss || !matches!(objective, Objective::Policy(_));
    let reference = Reference::for_recipe(recipe, &pipe, needs_reference, device, dtypes)?;
    let mut learner = Learner {
        ema: t.ema_decay.map(|d| Ema::new(d, &params)),
        // DiffusionNFT's old policy starts as a copy of the trained weights.
        old: (objective == Objective::Nft).then(|| Ema::new(0.0, &params)),
        optimizer: AdamW::new(params, t.betas, t.eps, t.weight_decay),
    };
    let resume_from = match t.resume.as_str() {
        "none" => None,
        "auto" => checkpoint::complete_checkpoints(&ckpt_root)?.pop().map(|(_, dir)| dir),
        path => {
            let dir = PathBuf::from(path);
            if !dir.join("state.json").exists() {
                return Err(TrainError::Invalid(format!(
                    "trainer.resume: {path} is not a complete checkpoint directory (no state.json); use auto, none or a checkpoints/step_NNNNNN directory"
                )));
            }
            Some(dir)
        }
    };
    let mut start = 0;
    if let Some(dir) = &resume_from {
        let state = checkpoint::load(dir, &mut pipe.transformer, &mut learner)?;
        source.loader().state = state.loader;
        start = state.step;
        eprintln!("resumed from {} (step {start})", dir.display());
    }

    let run = Run {
        recipe,
        engine: Engine::new(&pipe, &recipe.rollout, recipe.model.resolution, recipe.seed)?,
        reference,
    };
    let metrics_path = out_dir.join("metrics.jsonl");
    keep_metrics_up_to(&metrics_path, start)?;
    let mut metrics_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&metrics_path)
        .map_err(|e| TrainError::Io(format!("{}: {e}", metrics_path.display())))?;
    let mut events = crate::tensorboard::EventWriter::create(&out_dir.join("tensorboard"))?;
    let bar = indicatif::ProgressBar::new(t.total_steps).with_position(start);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} step {pos}/{len} [{bar:30}] {elapsed_precise} (eta {eta}) {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    // Ctrl-C finishes the current step, saves a checkpoint and returns.
    let interrupted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = interrupted.clone();
    // A second trainer in the same process cannot install a handler again; it then runs without one.
    let _ = ctrlc::set_handler(move || flag.store(true, std::sync::atomic::Ordering::SeqCst));
    let mut all = vec![];
    let mut last = start;
    if t.val_before_train && start == 0 {
        bar.set_message("validation");
        let timer = Instant::now();
        let mut m = validate(&pipe, recipe, &val_records, &scorers, 0)?;
        m.insert("timing_s/testing".into(), timer.elapsed().as_secs_f64());
        log_metrics(&mut metrics_file, &mut events, 0, &m)?;
        say(&bar, format!("validation before training: {}", summary_line(&m)));
    }
    let training = Instant::now();
    for k in start + 1..=t.total_steps {
        let step_start = Instant::now();
        let mut m = Metrics::new();
        let lr = learning_rate(t.lr_schedule, t.lr, k - 1, t.warmup_steps, t.total_steps);
        bar.set_message("rollout + reward");
        let samples = match (&mut source, objective) {
            (Source::Pairs(pairs), _) => {
                bar.set_message("update");
                crate::preference::offline_step(&run, &mut learner, pairs, k, lr, &mut m)?;
                2 * recipe.data.prompts_per_step
            }
            (Source::Prompts(loader), Objective::Policy(loss)) => {
                let c = collect(&run.engine, loader, &scorers, recipe, k, &mut m)?;
                bar.set_message("update");
                crate::policy::policy_step(&run, &mut learner, loss, &c, k, lr, &mut m)?;
                c.batch.images.len()
            }
            (Source::Prompts(loader), Objective::Dpo) => {
                let c = collect(&run.engine, loader, &scorers, recipe, k, &mut m)?;
                bar.set_message("update");
                crate::preference::online_step(&run, &mut learner, &c, k, lr, &mut m)?;
                c.batch.images.len()
            }
            (Source::Prompts(loader), Objective::Nft) => {
                // The old policy samples.
                let old = learner.old.as_mut().expect("diffusion_nft keeps an old policy");
                old.swap(&learner.optimizer.params);
                let c = collect(&run.engine, loader, &scorers, recipe, k, &mut m);
                old.swap(&learner.optimizer.params);
                let c = c?;
                bar.set_message("update");
                crate::nft::nft_step(&run, &mut learner, &c, k, lr, &mut m)?;
                c.batch.images.len()
            }
        };
        m.insert("actor/lr".into(), lr);

        let out_of_time = t.time_limit_s.is_some_and(|l| training.elapsed().as_secs_f64() >= l);
        let last_step = k == t.total_steps || out_of_time;

        // testing
        if t.val_freq > 0 && (k.is_multiple_of(t.val_freq) || last_step) {
            bar.set_message("validation");
            let timer = Instant::now();
            // Validation sees the EMA weights when there are some.
            if let Some(ema) = learner.ema.as_mut() {
                ema.swap(&learner.optimizer.params);
            }
            let scores = validate(&pipe, recipe, &val_records, &scorers, k);
            if let Some(ema) = learner.ema.as_mut() {
                ema.swap(&learner.optimizer.params);
            }
            m.extend(scores?);
            m.insert("timing_s/testing".into(), timer.elapsed().as_secs_f64());
        }

        // checkpoint
        let timer = Instant::now();
        let stop = interrupted.load(std::sync::atomic::Ordering::SeqCst);
        if (t.save_freq > 0 && k.is_multiple_of(t.save_freq)) || last_step || stop {
            let state = LoopState {
                step: k,
                loader: source.loader().state,
                optimizer_steps: learner.optimizer.steps,
            };
            checkpoint::save(&ckpt_root, &pipe.transformer, &learner, &state, t.keep_last)?;
        }
        m.insert("timing_s/save_checkpoint".into(), timer.elapsed().as_secs_f64());
        let elapsed = step_start.elapsed().as_secs_f64();
        m.insert("timing_s/step".into(), elapsed);
        m.insert("perf/throughput".into(), samples as f64 / elapsed);

        log_metrics(&mut metrics_file, &mut events, k, &m)?;
        bar.inc(1);
        say(&bar, step_line(k, t.total_steps, &m, elapsed));
        if m.contains_key("timing_s/testing") {
            say(&bar, format!("validation at step {k}: {}", summary_line(&m)));
        }
        all.push(m);
        last = k;
        if stop {
            eprintln!("interrupted: saved a checkpoint at step {k}; rerun with trainer.resume: auto to continue");
            break;
        }
        if out_of_time && k < t.total_steps {
            say(&bar, format!("trainer.time_limit_s reached after step {k}; stopping"));
            break;
        }
    }
    bar.finish_and_clear();
    let export = export_weights(&pipe, out_dir, false)?;
    if let Some(ema) = learner.ema.as_mut() {
        ema.swap(&learner.optimizer.params);
        let saved = export_weights(&pipe, out_dir, true);
        ema.swap(&learner.optimizer.params);
        saved?;
    }
    Ok(TrainSummary { metrics: all, export, steps_run: last - start })
}

/// The per-step line: the reward when there is one, the loss and the algorithm's telltales.
fn step_line(k: u64, total: u64, m: &Metrics, seconds: f64) -> String {
    let mut line = format!("step {k}/{total}");
    for (key, label) in [
        ("critic/rewards/mean", "reward"),
        ("actor/loss", "loss"),
        ("actor/pg_clipfrac", "clipfrac"),
        ("actor/ppo_kl", "kl"),
        ("actor/implicit_acc", "implicit_acc"),
        ("actor/kl_loss", "kl_loss"),
    ] {
        if let Some(v) = m.get(key) {
            let v =
                if v.abs() < 1e-2 && *v != 0.0 { format!("{v:.2e}") } else { format!("{v:.4}") };
            line.push_str(&format!("  {label} {v}"));
        }
    }
    line + &format!("  {seconds:.1}s")
}

/// Writes the trained weights for use outside flowtune: the LoRA in the diffusers/PEFT layout
/// (`lora/pytorch_lora_weights.safetensors`), or after full fine-tuning a diffusers
/// `transformer/` folder to put in place of the pipeline's. `ema` names the EMA variant.
fn export_weights(pipe: &Sd3Pipeline, out_dir: &Path, ema: bool) -> Result<PathBuf, TrainError> {
    let io = |p: &Path, e: std::io::Error| TrainError::Io(format!("{}: {e}", p.display()));
    let model = &pipe.transformer;
    let (dir, file) = match (&model.adapters, ema) {
        (Some(_), false) => (out_dir.join("lora"), "pytorch_lora_weights.safetensors"),
        (Some(_), true) => (out_dir.join("lora"), "ema_lora_weights.safetensors"),
        (None, false) => (out_dir.join("transformer"), "diffusion_pytorch_model.safetensors"),
        (None, true) => (out_dir.join("ema_transformer"), "diffusion_pytorch_model.safetensors"),
    };
    std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
    let path = dir.join(file);
    if model.adapters.is_some() {
        model.save_lora(&path)?;
    } else {
        model.save_weights(&path)?;
        let config = pipe.dir.root.join("transformer").join("config.json");
        std::fs::copy(&config, dir.join("config.json")).map_err(|e| io(&config, e))?;
    }
    Ok(path)
}

/// Appends step `k`'s metrics to the JSONL file and the TensorBoard events.
fn log_metrics(
    file: &mut std::fs::File,
    events: &mut crate::tensorboard::EventWriter,
    k: u64,
    m: &Metrics,
) -> Result<(), TrainError> {
    let mut line = serde_json::Map::new();
    line.insert("step".into(), k.into());
    for (key, v) in m {
        line.insert(key.clone(), serde_json::json!(v));
    }
    writeln!(file, "{}", serde_json::Value::Object(line))
        .map_err(|e| TrainError::Io(e.to_string()))?;
    events.scalars(k, m)
}

/// Prints a line above the progress bar; without a terminal (bar hidden) to stderr as it is.
fn say(bar: &indicatif::ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}

/// The validation metrics as `name value` pairs on one line.
fn summary_line(m: &Metrics) -> String {
    m.iter()
        .filter(|(k, _)| k.starts_with("val-core/"))
        .map(|(k, v)| format!("{} {v:.4}", k.trim_start_matches("val-core/")))
        .collect::<Vec<_>>()
        .join("  ")
}

/// Drops the lines of steps after `step` (logged after the checkpoint a run resumes from).
fn keep_metrics_up_to(path: &std::path::Path, step: u64) -> Result<(), TrainError> {
    let Ok(text) = std::fs::read_to_string(path) else { return Ok(()) };
    let kept: String = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v["step"].as_u64())
                .is_some_and(|s| s <= step)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(path, kept).map_err(|e| TrainError::Io(format!("{}: {e}", path.display())))
}
