//! `flowtune sample` (ODE sampling to PNGs, with or without a LoRA) and `flowtune export-lora`.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use clap::Args;
use flowtune_data::PromptDataset;
use flowtune_models::{lora, PipelineOptions};
use flowtune_rollout::Engine;
use flowtune_sampling::{SamplerConfig, SigmaGrid};

use crate::device::DeviceArg;
use crate::Failure;

#[derive(Args)]
pub struct SampleArgs {
    /// A diffusers pipeline directory.
    #[arg(long)]
    model: PathBuf,
    /// A LoRA in the diffusers/PEFT layout (e.g. a run's lora/pytorch_lora_weights.safetensors).
    #[arg(long)]
    lora: Option<PathBuf>,
    /// Prompts: text (one per line) or JSONL.
    #[arg(long)]
    prompts: PathBuf,
    #[arg(long, default_value_t = 40)]
    steps: usize,
    /// The sampler's sigmas instead of the pipeline's grid, comma-separated, decreasing in
    /// (0, 1], a final 0 appended if not given (`--steps` is their count): a few-step student's,
    /// e.g. a DMD2 run's `1,0.9,0.75,0.5,0` (its `export_manifest.json`), with `--guidance 1`.
    #[arg(long, value_delimiter = ',')]
    sigmas: Option<Vec<f32>>,
    /// CFG scale; ≤ 1 disables CFG.
    #[arg(long, default_value_t = 4.5)]
    guidance: f64,
    /// CFG scale of the low-noise expert's steps (two-expert pipelines: Wan2.2-A14B); default
    /// `--guidance`.
    #[arg(long)]
    guidance_2: Option<f64>,
    /// The distilled guidance of a guidance-embedding model (FLUX.1 [dev]; its default 3.5).
    #[arg(long)]
    embedded_guidance: Option<f64>,
    /// Pixel frames of a video family's samples (Wan: 4k+1; its default 81).
    #[arg(long)]
    num_frames: Option<usize>,
    /// Frames per second of a family with sound (LTX-2; its default 24).
    #[arg(long)]
    frame_rate: Option<f64>,
    /// The side whose square condition pictures are sized to (Qwen-Image 2.1's
    /// `output_resolution`; its default 1024).
    #[arg(long)]
    output_resolution: Option<i64>,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Image height and width in pixels.
    #[arg(long, default_value_t = 512)]
    resolution: i64,
    /// Images per forward batch.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Output directory for `NNNNN.png` (a video's frames side by side), `NNNNN.wav` for a
    /// family with sound, and `prompts.jsonl`.
    #[arg(long)]
    out: PathBuf,
}

pub fn sample(a: SampleArgs, device: &DeviceArg) -> Result<(), Failure> {
    let device = device.resolve()?;
    let lora_config = a
        .lora
        .as_deref()
        .map(|f| lora::read_config(f, "transformer"))
        .transpose()
        .map_err(Failure::input)?;
    let options = PipelineOptions {
        lora: lora_config,
        embedded_guidance: a.embedded_guidance,
        num_frames: a.num_frames,
        frame_rate: a.frame_rate,
        output_resolution: a.output_resolution,
        ..PipelineOptions::new(device)
    };
    let mut pipe = flowtune_models::load_pipeline(&a.model, &options).map_err(Failure::input)?;
    if let Some(f) = &a.lora {
        pipe.denoiser_mut().load_lora(f).map_err(Failure::input)?;
    }
    let records = PromptDataset::load(&a.prompts).map_err(Failure::input)?.records;
    let grid = a.sigmas.as_deref().map(student_grid).transpose().map_err(Failure::input)?;
    let sampler = SamplerConfig {
        n: 1,
        steps: grid.as_ref().map_or(a.steps, |g| g.timesteps.len()),
        guidance_scale: a.guidance,
        guidance_scale_2: a.guidance_2,
        noise_level: 0.0,
        ..Default::default()
    };
    sampler.validate().map_err(Failure::input)?;
    let latent_shape = pipe
        .latent_shape(a.resolution, a.resolution)
        .map_err(|e| Failure::input(anyhow!("--resolution {e}")))?;
    let engine =
        Engine::new(pipe.as_ref(), &sampler, latent_shape, a.seed).map_err(Failure::input)?;
    let engine = match grid {
        Some(grid) => engine.with_grid(grid),
        None => engine,
    };
    std::fs::create_dir_all(&a.out)
        .with_context(|| a.out.display().to_string())
        .map_err(Failure::Runtime)?;
    let mut index = vec![];
    for (chunk_no, chunk) in records.chunks(a.batch.max(1)).enumerate() {
        let prompts: Vec<&str> = chunk.iter().map(|r| r.prompt.as_str()).collect();
        let negatives: Vec<&str> = chunk
            .iter()
            .map(|r| r.negative_prompt.as_deref().unwrap_or(pipe.default_negative_prompt()))
            .collect();
        // Image i is seeded `row_seed(seed, 1, i)`: the batch size does not change the images.
        let first = (chunk_no * a.batch.max(1)) as u64;
        let seeds: Vec<u64> = (first..first + prompts.len() as u64)
            .map(|i| flowtune_sampling::row_seed(a.seed, 1, i))
            .collect();
        let pictures = chunk
            .iter()
            .map(|r| r.load_images(pipe.takes_alpha()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(Failure::input)?;
        let pictures = if pictures.iter().all(Vec::is_empty) { vec![] } else { pictures };
        let batch = engine
            .rollout(&prompts, &negatives, &pictures, &seeds, 1)
            .map_err(|e| Failure::Runtime(e.into()))?;
        for (i, (image, prompt)) in batch.images.iter().zip(&prompts).enumerate() {
            let file = format!("{:05}.png", chunk_no * a.batch.max(1) + i);
            image
                .save(a.out.join(&file))
                .with_context(|| file.clone())
                .map_err(Failure::Runtime)?;
            let mut row = serde_json::json!({ "file": file, "prompt": prompt });
            if let Some(sound) = batch.audio.get(i) {
                let wav = file.replace(".png", ".wav");
                let bytes = sound.wav().map_err(|e| Failure::Runtime(e.into()))?;
                std::fs::write(a.out.join(&wav), bytes)
                    .with_context(|| wav.clone())
                    .map_err(Failure::Runtime)?;
                row["audio"] = wav.into();
            }
            index.push(row.to_string());
        }
        eprintln!("sampled {}/{}", (chunk_no * a.batch.max(1) + chunk.len()), records.len());
    }
    std::fs::write(a.out.join("prompts.jsonl"), index.join("\n") + "\n")
        .map_err(|e| Failure::Runtime(e.into()))?;
    println!("wrote {} images to {}", index.len(), a.out.display());
    Ok(())
}

/// Copies a checkpoint's adapters (already in the diffusers/PEFT layout) to `out`, after checking them.
pub fn export_lora(checkpoint: &Path, out: &Path) -> Result<(), Failure> {
    let source = if checkpoint.is_dir() {
        checkpoint.join("adapters.safetensors")
    } else {
        checkpoint.to_path_buf()
    };
    if checkpoint.join("transformer.safetensors").exists() {
        return Err(Failure::input(anyhow!(
            "{}: a full fine-tuning checkpoint has no LoRA; its weights are transformer.safetensors (diffusers names), and training writes a transformer/ folder at the end",
            checkpoint.display()
        )));
    }
    if !source.exists() {
        return Err(Failure::input(anyhow!(
            "{}: no adapters.safetensors (expected a checkpoint directory)",
            checkpoint.display()
        )));
    }
    let config = lora::read_config(&source, "transformer").map_err(Failure::input)?;
    std::fs::copy(&source, out)
        .with_context(|| format!("copying to {}", out.display()))
        .map_err(Failure::Runtime)?;
    println!(
        "wrote {} (r {}, alpha {}, {} target modules)",
        out.display(),
        config.rank,
        config.alpha,
        config.target_modules.len()
    );
    Ok(())
}

/// The grid of `--sigmas`: them and a final 0, timesteps `1000·σ`; refused unless they decrease
/// strictly within (0, 1].
fn student_grid(sigmas: &[f32]) -> anyhow::Result<SigmaGrid> {
    // A manifest's list ends with the 0.
    let sigmas = sigmas.strip_suffix(&[0.0]).unwrap_or(sigmas);
    let decreasing = sigmas.windows(2).all(|w| w[1] < w[0]);
    let within = sigmas.iter().all(|&s| s > 0.0 && s <= 1.0);
    if sigmas.is_empty() || !decreasing || !within {
        anyhow::bail!("--sigmas {sigmas:?}: expected values decreasing strictly within (0, 1], e.g. 1,0.9,0.75,0.5");
    }
    let timesteps = sigmas.iter().map(|s| s * 1000.0).collect();
    let sigmas = sigmas.iter().copied().chain([0.0]).collect();
    Ok(SigmaGrid { sigmas, timesteps, mu: None })
}
