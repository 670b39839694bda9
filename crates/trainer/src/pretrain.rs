//! `flowtune pretrain`: plain flow-matching training of every parameter of a pipeline (the denoiser
//! and the text encoders its family trains with it, e.g. SD3's two CLIPs) on captioned images,
//! the way SD3 was trained: images become clean latents through the pipeline (pixels for a
//! pixel-space one), σ from a shifted logit-normal, `x_σ = (1 − σ)·x₀ + σ·ε`, the model regresses
//! the velocity `ε − x₀`; the caption is dropped (empty prompt) with probability `caption_dropout`
//! so classifier-free guidance works. The result is written as a complete pipeline directory in
//! the diffusers layout.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use flowtune_config::LrSchedule;
use flowtune_models::{velocity_at_sigma, FlowPipeline, PipelineOptions};
use flowtune_rewards::RgbImage;
use flowtune_sampling::{per_row, SampleRng};
use tch::{Device, Kind, Tensor};

use crate::optim::{learning_rate, AdamW, Ema};
use crate::TrainError;

/// Settings of a pre-training run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PretrainConfig {
    /// The pipeline to start from (e.g. `flowtune make-tiny shapes`).
    pub model: PathBuf,
    /// Where the trained pipeline goes (a complete copy of `model` with new weights).
    pub out: PathBuf,
    pub steps: u64,
    pub batch_size: usize,
    pub lr: f64,
    pub warmup_steps: u64,
    pub weight_decay: f64,
    pub max_grad_norm: f64,
    pub caption_dropout: f64,
    /// Share of examples whose picture is a near miss of the caption; applied by the caller's
    /// `examples`, recorded here with the other settings.
    pub caption_noise: f64,
    /// Share of examples whose picture is faded; applied by the caller's `examples` too.
    pub faded: f64,
    /// EMA of the weights, which is what gets saved; `None` saves the live weights.
    pub ema_decay: Option<f64>,
    pub resolution: i64,
    pub seed: u64,
    /// Save the pipeline every this many steps (and at the end).
    pub save_every: u64,
}

/// What a finished run reports.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PretrainSummary {
    pub steps: u64,
    /// Mean loss over the last 10 % of steps.
    pub final_loss: f64,
    pub wall_seconds: f64,
}

/// Trains every parameter of the pipeline at `config.model` on `examples(index)` (a caption and
/// an image of `config.resolution` pixels, deterministic in `index`) and writes it to `config.out`.
pub fn pretrain(
    config: &PretrainConfig,
    examples: &(dyn Fn(u64) -> (String, RgbImage) + Sync),
    device: Device,
) -> Result<PretrainSummary, TrainError> {
    let pipe = flowtune_models::load_pipeline(&config.model, &PipelineOptions::new(device))?;
    let denoiser = pipe.denoiser().lora_prefix();
    let mut params: BTreeMap<String, Tensor> = pipe
        .denoiser()
        .full_parameters()
        .into_iter()
        .map(|(n, v)| (format!("{denoiser}.{n}"), v))
        .collect();
    for (folder, _, store) in pipe.trained_stores().into_iter().filter(|c| c.0 != denoiser) {
        for (name, var) in store.variables() {
            params.insert(format!("{folder}.{name}"), var.set_requires_grad(true));
        }
    }
    let mut optimizer = AdamW::new(params, [0.9, 0.999], 1e-8, config.weight_decay, false);
    let mut ema = config.ema_decay.map(|d| Ema::new("ema", d, &optimizer.params, false));
    let mut rng = SampleRng::new(config.seed);
    let shift = pipe.scheduler().static_shift();
    let bar = indicatif::ProgressBar::new(config.steps);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} pretrain {pos}/{len} [{bar:30}] {elapsed_precise} (eta {eta}) {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    let start = Instant::now();
    let mut losses = vec![];
    for step in 1..=config.steps {
        let first = (step - 1) * config.batch_size as u64;
        let batch: Vec<(String, RgbImage)> =
            (first..first + config.batch_size as u64).map(examples).collect();
        let x0 =
            pipe.encode_rgb8(&images_to_tensor(&batch, config.resolution)?.to_device(device))?;
        let b = x0.size()[0];
        let drop = rng.uniform(&[b], Device::Cpu);
        let prompts: Vec<&str> = batch
            .iter()
            .enumerate()
            .map(|(i, (caption, _))| {
                if drop.double_value(&[i as i64]) < config.caption_dropout {
                    ""
                } else {
                    caption.as_str()
                }
            })
            .collect();
        // σ: logit-normal u, shifted as the scheduler shifts its grid.
        let u = rng.normal(&[b], device).sigmoid();
        let sigma = &u * shift / (&u * (shift - 1.0) + 1.0);
        let noise = rng.normal(&x0.size(), device);
        let s = per_row(&sigma, &x0);
        let noisy = (1.0 - &s) * &x0 + &s * &noise;
        let text = pipe.encode_prompts(&prompts)?;
        let v = velocity_at_sigma(pipe.denoiser(), &noisy, &sigma, &text)?;
        let loss = (v - (&noise - &x0)).square().mean(Kind::Float);
        let value = loss.double_value(&[]);
        if !value.is_finite() {
            return Err(TrainError::Diverged(format!(
                "pretrain step {step}: loss is {value}; lower --lr (now {})",
                config.lr
            )));
        }
        loss.backward();
        optimizer.clip_grad_norm(config.max_grad_norm);
        let lr = learning_rate(
            LrSchedule::Cosine,
            config.lr,
            step - 1,
            config.warmup_steps,
            config.steps,
        );
        optimizer.step(lr, &Default::default());
        optimizer.zero_grad();
        if let (Some(ema), Some(decay)) = (ema.as_mut(), config.ema_decay) {
            // Warm-up: early on the average follows the weights closely.
            ema.decay = decay.min((1.0 + step as f64) / (10.0 + step as f64));
            ema.update(&optimizer.params);
        }
        losses.push(value);
        let recent = &losses[losses.len().saturating_sub(50)..];
        let message =
            format!("loss {:.4}  lr {lr:.2e}", recent.iter().sum::<f64>() / recent.len() as f64);
        // Without a terminal the bar is hidden: a line every 100 steps instead.
        if bar.is_hidden() && step % 100 == 0 {
            eprintln!(
                "pretrain step {step}/{}  {message}  {:.0} s",
                config.steps,
                start.elapsed().as_secs_f64()
            );
        }
        bar.set_message(message);
        bar.inc(1);
        if step % config.save_every == 0 || step == config.steps {
            let save = || save_pipeline(pipe.as_ref(), &config.model, &config.out);
            match ema.as_mut() {
                Some(ema) => ema.with_swapped(&optimizer.params, save)?,
                None => save()?,
            }
        }
    }
    bar.finish();
    let tail = &losses[losses.len() - (losses.len() / 10).max(1)..];
    let summary = PretrainSummary {
        steps: config.steps,
        final_loss: tail.iter().sum::<f64>() / tail.len() as f64,
        wall_seconds: start.elapsed().as_secs_f64(),
    };
    let record = serde_json::json!({ "config": config, "summary": summary });
    let path = config.out.join("pretrain.json");
    std::fs::write(&path, serde_json::to_string_pretty(&record).expect("JSON") + "\n")
        .map_err(|e| TrainError::io(&path, e))?;
    Ok(summary)
}

/// (B, R, R, 3) u8 pixels, checking every image is R × R.
fn images_to_tensor(batch: &[(String, RgbImage)], resolution: i64) -> Result<Tensor, TrainError> {
    let mut bytes = Vec::with_capacity(batch.len() * (3 * resolution * resolution) as usize);
    for (caption, image) in batch {
        if (image.width() as i64, image.height() as i64) != (resolution, resolution) {
            return Err(TrainError::Invalid(format!(
                "example {caption:?} is {}×{}, expected {resolution}×{resolution}",
                image.width(),
                image.height()
            )));
        }
        bytes.extend_from_slice(image.as_raw());
    }
    Ok(Tensor::from_slice(&bytes).view([batch.len() as i64, resolution, resolution, 3]))
}

/// Writes the pipeline at `out`: every file of `source` but the weights, then each trained
/// component's weights; built in a temporary directory and renamed into place.
fn save_pipeline(pipe: &dyn FlowPipeline, source: &Path, out: &Path) -> Result<(), TrainError> {
    let io = TrainError::io;
    let name = out.file_name().and_then(|n| n.to_str()).unwrap_or("pipeline");
    let tmp = out.with_file_name(format!(".{name}.tmp"));
    let _ = std::fs::remove_dir_all(&tmp);
    copy_without_weights(source, &tmp)?;
    for (folder, file, store) in pipe.trained_stores() {
        let mut named: Vec<(String, Tensor)> = store.variables().into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let named: Vec<(String, Tensor)> =
            named.into_iter().map(|(n, t)| (n, t.detach().to_device(Device::Cpu))).collect();
        Tensor::write_safetensors(&named, tmp.join(folder).join(file))?;
    }
    let old = out.with_file_name(format!(".{name}.old"));
    let _ = std::fs::remove_dir_all(&old);
    if out.exists() {
        std::fs::rename(out, &old).map_err(|e| io(out, e))?;
    }
    std::fs::rename(&tmp, out).map_err(|e| io(out, e))?;
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
}

/// Copies the tree at `from` to `to`, leaving out `*.safetensors` and the run record.
fn copy_without_weights(from: &Path, to: &Path) -> Result<(), TrainError> {
    let io = TrainError::io;
    std::fs::create_dir_all(to).map_err(|e| io(to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| io(from, e))? {
        let path = entry.map_err(|e| io(from, e))?.path();
        let target = to.join(path.file_name().expect("a named entry"));
        if path.is_dir() {
            copy_without_weights(&path, &target)?;
        } else if path.extension().is_none_or(|e| e != "safetensors")
            && path.file_name().is_some_and(|n| n != "pretrain.json")
        {
            std::fs::copy(&path, &target).map_err(|e| io(&path, e))?;
        }
    }
    Ok(())
}
