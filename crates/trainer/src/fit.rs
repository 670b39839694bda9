//! The training loop, step by step as the algorithm reads.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use flowtune_config::{Finetune, OldLogProb, Recipe};
use flowtune_data::{PromptDataset, PromptLoader, PromptRecord};
use flowtune_models::sd3::{Dtypes, Sd3Pipeline, Sd3Transformer};
use flowtune_objectives::{group_advantages, Metrics, Objective};
use flowtune_sampling::row_seed;
use tch::{Device, Kind, Tensor};

use crate::checkpoint::{self, LoopState};
use crate::engine::Engine;
use crate::optim::{learning_rate, AdamW};
use crate::scoring::{rollout_and_score, Scored};
use crate::update::{replay_all, update_actor, OldPolicy, UpdateInputs};
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

fn stats(prefix: &str, values: &[f64], out: &mut Metrics) {
    let n = values.len().max(1) as f64;
    out.insert(format!("{prefix}/mean"), values.iter().sum::<f64>() / n);
    out.insert(format!("{prefix}/max"), values.iter().cloned().fold(f64::NEG_INFINITY, f64::max));
    out.insert(format!("{prefix}/min"), values.iter().cloned().fold(f64::INFINITY, f64::min));
}

/// Runs `recipe` on `device` until `trainer.total_steps`, resuming as `trainer.resume` says.
pub fn train(recipe: &Recipe, device: Device) -> Result<TrainSummary, TrainError> {
    let algorithm = flowtune_objectives::algorithm(&recipe.algorithm)?;
    let Objective::Policy(loss_kind) = algorithm.objective else {
        return Err(TrainError::Invalid(format!("algorithm `{}` is not yet supported by the trainer; use a policy-gradient algorithm (flow_grpo, dance_grpo, mix_grpo, grpo_guard, flow_dppo)", algorithm.name)));
    };
    let t = &recipe.trainer;
    if t.old_log_prob == OldLogProb::Bypass && loss_kind.needs_means() {
        return Err(TrainError::Invalid(format!(
            "{} needs the old policy's transition means, which bypass mode does not compute; set trainer.old_log_prob: recompute",
            loss_kind.name()
        )));
    }
    if recipe.rollout.noise_level == 0.0 {
        return Err(TrainError::Invalid(
            "rollout.noise_level is 0: deterministic steps have no log-prob to train; set it > 0 (e.g. 0.7)".into(),
        ));
    }
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

    let files = &recipe.data.train_files;
    if files.is_empty() {
        return Err(TrainError::Invalid(
            "data.train_files is empty; give at least one prompt file".into(),
        ));
    }
    let mut records = vec![];
    for f in files {
        records.extend(PromptDataset::load(f)?.records);
    }
    let n = recipe.rollout.n;
    let mut loader =
        PromptLoader::new(PromptDataset { records }, recipe.data.prompts_per_step, n, recipe.seed)?;
    loader.shuffle = recipe.data.shuffle;
    loader.drop_last = recipe.data.drop_last;
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

    let params: BTreeMap<String, Tensor> = match &pipe.transformer.adapters {
        Some(adapters) => adapters.store.variables().into_iter().collect(),
        None => pipe.transformer.full_parameters(),
    };
    // The KL reference: the base model under LoRA (adapters off), a frozen copy otherwise.
    let frozen_reference = if finetune == Finetune::Full && recipe.actor.use_kl_loss {
        let dir = pipe.dir.component("transformer", &["SD3Transformer2DModel"])?;
        let mut copy = Sd3Transformer::load(&dir, device, dtypes.transformer, None)?;
        copy.store.freeze();
        Some(copy)
    } else {
        None
    };
    let mut ema = t.ema_decay.map(|d| crate::optim::Ema::new(d, &params));
    let mut optimizer = AdamW::new(params, t.betas, t.eps, t.weight_decay);
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
        let state = checkpoint::load(dir, &mut pipe.transformer, &mut optimizer, ema.as_mut())?;
        loader.state = state.loader;
        start = state.step;
        eprintln!("resumed from {} (step {start})", dir.display());
    }

    let engine = Engine::new(&pipe, &recipe.rollout, recipe.model.resolution, recipe.seed)?;
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
    for k in start + 1..=t.total_steps {
        let step_start = Instant::now();
        let mut m = Metrics::new();
        let rows = loader.next_step();
        let records: Vec<&PromptRecord> = rows.iter().map(|r| loader.record(r)).collect();
        let prompts: Vec<&str> = records.iter().map(|r| r.prompt.as_str()).collect();

        // gen + reward (each rollout chunk is scored while the next one samples)
        bar.set_message("rollout + reward");
        let timer = Instant::now();
        let seeds = engine.row_seeds(records.len(), k);
        let Scored { batch, scores: scored, reward_seconds } =
            rollout_and_score(&engine, &records, &seeds, k, &scorers, recipe.reward.on_error)?;
        m.insert("timing_s/gen".into(), timer.elapsed().as_secs_f64());
        m.insert("timing_s/reward".into(), reward_seconds);
        for e in &scored.errors {
            eprintln!("step {k}: skipped samples after a reward failure: {e}");
        }
        m.extend(scored.metrics());
        if t.image_freq > 0 && k % t.image_freq == 0 {
            let shown = batch.images.len().min(16);
            let captions: Vec<(String, f64)> = (0..shown)
                .map(|i| (prompts[i].to_string(), scored.totals[i].unwrap_or(f64::NAN)))
                .collect();
            crate::images::save_grid(
                &out_dir.join("images"),
                &format!("train_step_{k:06}"),
                &batch.images[..shown],
                &captions,
            )?;
        }
        let kept: Vec<usize> = (0..rows.len()).filter(|&i| scored.totals[i].is_some()).collect();
        if kept.is_empty() {
            let why = if scored.errors.is_empty() {
                "non-finite scores".to_string()
            } else {
                scored.errors.join("; ")
            };
            return Err(TrainError::Invalid(format!(
                "step {k}: every sample was dropped by reward.on_error: skip_sample ({why})"
            )));
        }
        let rewards: Vec<f32> = kept.iter().map(|&i| scored.totals[i].unwrap() as f32).collect();
        let uids: Vec<&str> = kept.iter().map(|&i| rows[i].uid.as_str()).collect();
        stats("critic/rewards", &rewards.iter().map(|&r| r as f64).collect::<Vec<_>>(), &mut m);

        // old log-probs
        bar.set_message("old log-probs");
        let w = batch.windows[0].len() as i64;
        let kept_idx = Tensor::from_slice(&kept.iter().map(|&i| i as i64).collect::<Vec<_>>())
            .to_device(device);
        let rollout_lp = batch.trajectory.all_log_probs.index_select(0, &kept_idx);
        let timer = Instant::now();
        let old = match t.old_log_prob {
            OldLogProb::Recompute => {
                let old = replay_all(
                    &engine,
                    &pipe.transformer,
                    &batch,
                    &kept_idx,
                    w,
                    loss_kind.needs_means(),
                )?;
                let drift = (&old.log_probs - &rollout_lp).abs();
                m.insert(
                    "rollout_corr/logprob_abs_diff_mean".into(),
                    drift.mean(Kind::Float).double_value(&[]),
                );
                m.insert("rollout_corr/logprob_abs_diff_max".into(), drift.max().double_value(&[]));
                old
            }
            OldLogProb::Bypass => {
                OldPolicy { log_probs: rollout_lp, means: None, std: None, sqrt_dt: None }
            }
        };
        m.insert("timing_s/old_log_prob".into(), timer.elapsed().as_secs_f64());

        // ref
        let timer = Instant::now();
        let reference = match &frozen_reference {
            _ if !recipe.actor.use_kl_loss => None,
            Some(copy) => Some(replay_all(&engine, copy, &batch, &kept_idx, w, true)?),
            None => {
                pipe.transformer.set_adapters_enabled(false);
                let r = replay_all(&engine, &pipe.transformer, &batch, &kept_idx, w, true);
                pipe.transformer.set_adapters_enabled(true);
                Some(r?)
            }
        };
        m.insert("timing_s/ref".into(), timer.elapsed().as_secs_f64());

        // adv
        let timer = Instant::now();
        let adv = group_advantages(&rewards, &uids, w as usize, &recipe.advantage)?;
        m.insert("critic/rewards/zero_std_ratio".into(), adv.zero_std_ratio);
        let adv_values = adv.values.to_device(device);
        let a: Vec<f64> =
            Vec::<f32>::try_from(adv.values.select(1, 0))?.into_iter().map(f64::from).collect();
        stats("critic/advantages", &a, &mut m);
        m.insert("timing_s/adv".into(), timer.elapsed().as_secs_f64());

        // update
        bar.set_message("update");
        let timer = Instant::now();
        let lr = learning_rate(t.lr_schedule, t.lr, k - 1, t.warmup_steps, t.total_steps);
        let inputs = UpdateInputs {
            engine: &engine,
            batch: &batch,
            rows: &kept_idx,
            old: &old,
            reference: reference.as_ref(),
            advantages: &adv_values,
            loss: loss_kind,
            window: w,
        };
        m.extend(update_actor(&inputs, recipe, &mut optimizer, ema.as_mut(), k, lr)?);
        m.insert("actor/lr".into(), lr);
        m.insert("timing_s/update_actor".into(), timer.elapsed().as_secs_f64());

        // testing
        if t.val_freq > 0 && (k % t.val_freq == 0 || k == t.total_steps) {
            let timer = Instant::now();
            // Validation sees the EMA weights when there are some.
            if let Some(ema) = ema.as_mut() {
                ema.swap(&optimizer.params);
            }
            let scores = validate(&pipe, recipe, &val_records, &scorers, k);
            if let Some(ema) = ema.as_mut() {
                ema.swap(&optimizer.params);
            }
            m.extend(scores?);
            m.insert("timing_s/testing".into(), timer.elapsed().as_secs_f64());
        }

        // checkpoint
        let timer = Instant::now();
        let stop = interrupted.load(std::sync::atomic::Ordering::SeqCst);
        if (t.save_freq > 0 && k % t.save_freq == 0) || k == t.total_steps || stop {
            let state =
                LoopState { step: k, loader: loader.state, optimizer_steps: optimizer.steps };
            checkpoint::save(
                &ckpt_root,
                &pipe.transformer,
                &optimizer,
                ema.as_ref(),
                &state,
                t.keep_last,
            )?;
        }
        m.insert("timing_s/save_checkpoint".into(), timer.elapsed().as_secs_f64());
        let elapsed = step_start.elapsed().as_secs_f64();
        m.insert("timing_s/step".into(), elapsed);
        m.insert("perf/throughput".into(), rows.len() as f64 / elapsed);

        log_metrics(&mut metrics_file, &mut events, k, &m)?;
        bar.inc(1);
        let line = format!(
            "step {k}/{}  reward {:.4}  loss {:.4}  clipfrac {:.3}  kl {:.2e}  {:.1}s",
            t.total_steps,
            m["critic/rewards/mean"],
            m.get("actor/loss").copied().unwrap_or(f64::NAN),
            m.get("actor/pg_clipfrac").copied().unwrap_or(0.0),
            m.get("actor/ppo_kl").copied().unwrap_or(0.0),
            elapsed
        );
        say(&bar, line);
        if m.contains_key("timing_s/testing") {
            say(&bar, format!("validation at step {k}: {}", summary_line(&m)));
        }
        all.push(m);
        last = k;
        if stop {
            eprintln!("interrupted: saved a checkpoint at step {k}; rerun with trainer.resume: auto to continue");
            break;
        }
    }
    bar.finish_and_clear();
    let export = export_weights(&pipe, out_dir, false)?;
    if let Some(ema) = ema.as_mut() {
        ema.swap(&optimizer.params);
        let saved = export_weights(&pipe, out_dir, true);
        ema.swap(&optimizer.params);
        saved?;
    }
    Ok(TrainSummary { metrics: all, export, steps_run: last - start })
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

/// Validation rollouts: η = 0, `rollout.eval_steps`, fixed per-prompt seeds from 42; rewards
/// averaged per data source as `val-core/<source>/reward/mean@1`, each reward extra as
/// `val-core/<source>/<extra>` (e.g. `val-core/shapes/counting/acc`), and a grid of the images.
fn validate(
    pipe: &Sd3Pipeline,
    recipe: &Recipe,
    records: &[flowtune_data::PromptRecord],
    scorers: &[flowtune_rewards::Weighted],
    k: u64,
) -> Result<Metrics, TrainError> {
    const VAL_SEED: u64 = 42;
    let sampler = validation_sampler(recipe);
    let engine = Engine::new(pipe, &sampler, recipe.model.resolution, VAL_SEED)?;
    // Per data source: the total reward and each extra (e.g. a category's accuracy).
    let mut per_source: BTreeMap<(String, String), (f64, usize)> = BTreeMap::new();
    let (mut images, mut captions) = (vec![], vec![]);
    let size = recipe.trainer.micro_batch_size;
    for (c, chunk) in records.chunks(size).enumerate() {
        let chunk: Vec<&PromptRecord> = chunk.iter().collect();
        // Prompt i's noise comes from `row_seed(42, 0, i)`: fixed, and different per prompt.
        let first = (c * size) as u64;
        let seeds: Vec<u64> =
            (first..first + chunk.len() as u64).map(|i| row_seed(VAL_SEED, 0, i)).collect();
        let Scored { batch, scores, .. } =
            rollout_and_score(&engine, &chunk, &seeds, 1, scorers, recipe.reward.on_error)?;
        for (i, r) in chunk.iter().enumerate() {
            let total = scores.totals[i];
            if let Some(v) = total {
                let source = &r.data_source;
                let extras = scores.details[i].extras.iter().map(|(k, v)| (k.as_str(), *v));
                for (key, value) in std::iter::once(("reward/mean@1", v)).chain(extras) {
                    let e = per_source.entry((source.clone(), key.to_string())).or_default();
                    e.0 += value;
                    e.1 += 1;
                }
            }
            captions.push((r.prompt.clone(), total.unwrap_or(f64::NAN)));
        }
        images.extend(batch.images);
    }
    let shown = images.len().min(64);
    crate::images::save_grid(
        &recipe.trainer.output_dir.join("images"),
        &format!("val_step_{k:06}"),
        &images[..shown],
        &captions[..shown],
    )?;
    Ok(per_source
        .into_iter()
        .map(|((source, key), (sum, n))| (format!("val-core/{source}/{key}"), sum / n as f64))
        .collect())
}

/// The sampler of validation rollouts: η = 0, `rollout.eval_steps`, no SDE window.
fn validation_sampler(recipe: &Recipe) -> flowtune_sampling::SamplerConfig {
    flowtune_sampling::SamplerConfig {
        noise_level: 0.0,
        steps: recipe.rollout.eval_steps,
        sde_window_size: 0,
        sde_window_range: None,
        ..recipe.rollout.clone()
    }
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
