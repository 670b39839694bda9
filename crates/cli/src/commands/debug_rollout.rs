//! `flowtune debug rollout`: one trajectory of any family from given initial latents and per-step
//! noise, written as tensors and pictures, to compare with a reference loop step by step.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{anyhow, Context};
use clap::Args;
use flowtune_data::PromptDataset;
use flowtune_models::PipelineOptions;
use flowtune_rollout::{sample_trajectory, Engine, Guidance, TrajectoryRequest};
use flowtune_sampling::{SamplerConfig, SdeType};
use tch::{Device, Kind, Tensor};

use crate::device::DeviceArg;
use crate::Failure;

#[derive(Args)]
pub struct RolloutArgs {
    /// A diffusers pipeline directory of any registered family.
    #[arg(long)]
    model: PathBuf,
    /// Prompts: text (one per line) or JSONL; one trajectory row per prompt.
    #[arg(long)]
    prompts: PathBuf,
    /// Safetensors with `initial_latents` (B, …latent shape) and `step_noise` (N, B, …): the
    /// Gaussian of every step, in flowtune's latent layout (`flowtune list` names it per family).
    #[arg(long)]
    noise: PathBuf,
    /// Where to write `all_latents`, `all_log_probs`, `all_timesteps`, `final_latents` and
    /// `images` (u8, B × H × W × 3); the pictures also go beside it as `<stem>_<row>.png`.
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value_t = 10)]
    steps: usize,
    /// CFG scale; ≤ 1 disables CFG.
    #[arg(long, default_value_t = 4.0)]
    guidance: f64,
    /// CFG scale of the low-noise expert's steps (two-expert pipelines: Wan2.2-A14B); default
    /// `--guidance`.
    #[arg(long)]
    guidance_2: Option<f64>,
    /// Noise level η of the SDE steps.
    #[arg(long, default_value_t = 0.7)]
    noise_level: f64,
    /// `sde` (Flow-GRPO) or `cps` (coefficient-preserving).
    #[arg(long, default_value = "sde")]
    sde_type: String,
    /// First stochastic step of every row.
    #[arg(long, default_value_t = 0)]
    window_start: usize,
    /// Stochastic steps (0: every step but the last).
    #[arg(long, default_value_t = 0)]
    window_size: usize,
    /// Text tokens of the family's long text encoder (its default when absent).
    #[arg(long)]
    max_sequence_length: Option<usize>,
    /// The distilled guidance of a guidance-embedding model (FLUX.1 [dev]; its default 3.5).
    #[arg(long)]
    embedded_guidance: Option<f64>,
    /// Pixel frames of a video family's samples (Wan: 4k+1; its default 81).
    #[arg(long)]
    num_frames: Option<usize>,
    /// The side whose square condition pictures are sized to (Qwen-Image 2.1's
    /// `output_resolution`; its default 1024).
    #[arg(long)]
    output_resolution: Option<i64>,
    /// Condition pictures every prompt shares (image editing, e.g. Qwen-Image-Edit-Plus),
    /// comma-separated; the negative prompt gets them too, as in diffusers.
    #[arg(long, value_delimiter = ',')]
    images: Vec<PathBuf>,
}

pub fn rollout(a: RolloutArgs, device: &DeviceArg) -> Result<(), Failure> {
    let device = device.resolve()?;
    let options = PipelineOptions {
        max_sequence_length: a.max_sequence_length,
        embedded_guidance: a.embedded_guidance,
        num_frames: a.num_frames,
        output_resolution: a.output_resolution,
        ..PipelineOptions::new(device)
    };
    let pipe = flowtune_models::load_pipeline(&a.model, &options).map_err(Failure::input)?;
    let records = PromptDataset::load(&a.prompts).map_err(Failure::input)?.records;
    let noise: HashMap<String, Tensor> = Tensor::read_safetensors(&a.noise)
        .with_context(|| format!("cannot read {}", a.noise.display()))
        .map_err(Failure::BadInput)?
        .into_iter()
        .map(|(n, t)| (n, t.to_kind(Kind::Float).to_device(device)))
        .collect();
    let get = |name: &str| {
        noise
            .get(name)
            .ok_or_else(|| Failure::input(anyhow!("{}: no tensor `{name}`", a.noise.display())))
    };
    let (initial, step_noise) = (get("initial_latents")?, get("step_noise")?);
    let b = records.len() as i64;
    let shape = initial.size();
    if shape[0] != b || step_noise.size()[0] != a.steps as i64 || step_noise.size()[1..] != shape {
        return Err(Failure::input(anyhow!(
            "{}: initial_latents {:?} and step_noise {:?} must be (B, …) and (N, B, …) for {b} \
             prompts and N = --steps {}",
            a.noise.display(),
            shape,
            step_noise.size(),
            a.steps
        )));
    }
    let sampler = SamplerConfig {
        n: 1,
        steps: a.steps,
        guidance_scale: a.guidance,
        guidance_scale_2: a.guidance_2,
        noise_level: a.noise_level,
        sde_type: serde_json::from_value::<SdeType>(a.sde_type.clone().into())
            .map_err(|e| Failure::input(anyhow!("--sde-type {}: {e}", a.sde_type)))?,
        sde_window_size: a.window_size,
        ..Default::default()
    };
    sampler.validate().map_err(Failure::input)?;
    let engine =
        Engine::new(pipe.as_ref(), &sampler, shape[1..].to_vec(), 0).map_err(Failure::input)?;
    let prompts: Vec<&str> = records.iter().map(|r| r.prompt.as_str()).collect();
    let negatives: Vec<&str> = records
        .iter()
        .map(|r| r.negative_prompt.as_deref().unwrap_or(pipe.default_negative_prompt()))
        .collect();
    let size = if a.window_size == 0 { a.steps - 1 } else { a.window_size };
    if a.window_start + size > a.steps {
        return Err(Failure::input(anyhow!(
            "--window-start {} + window size {size} exceed --steps {}",
            a.window_start,
            a.steps
        )));
    }
    let windows = vec![a.window_start..a.window_start + size; b as usize];
    let pictures = a
        .images
        .iter()
        .map(|p| flowtune_data::load_picture(p, pipe.takes_alpha()))
        .collect::<Result<Vec<_>, _>>()
        .context("--images")
        .map_err(Failure::BadInput)?;
    let encode = |prompts: &[&str]| {
        pipe.encode_prompts_with_pictures(prompts, &pictures, &engine.latent_shape)
    };
    let out = tch::no_grad(|| {
        let text = encode(&prompts)?;
        let negative =
            pipe.denoiser().runs_cfg(a.guidance).then(|| encode(&negatives)).transpose()?;
        let request = TrajectoryRequest {
            grid: &engine.grid,
            text: &text,
            guidance: Guidance {
                scale: a.guidance,
                scale_2: a.guidance_2,
                negative: negative.as_ref(),
            },
            step: sampler.step_params(engine.grid.sigmas[1] as f64),
            windows: &windows,
            initial,
        };
        sample_trajectory(pipe.denoiser(), &request, |i| step_noise.get(i as i64))
    })
    .map_err(Failure::input)?;
    let images = tch::no_grad(|| engine.decode(&out.final_latents)).map_err(Failure::input)?;
    let pixels: Vec<Tensor> = images
        .iter()
        .map(|im| {
            let (w, h) = im.dimensions();
            Tensor::from_slice(im.as_raw()).view([h as i64, w as i64, 3])
        })
        .collect();
    let named: Vec<(&str, Tensor)> = vec![
        ("all_latents", out.all_latents),
        ("all_log_probs", out.all_log_probs),
        ("all_timesteps", out.all_timesteps),
        ("final_latents", out.final_latents),
        ("images", Tensor::stack(&pixels, 0)),
    ];
    let cpu: Vec<(&str, Tensor)> =
        named.into_iter().map(|(n, t)| (n, t.to_device(Device::Cpu).contiguous())).collect();
    Tensor::write_safetensors(&cpu, &a.out)
        .with_context(|| format!("cannot write {}", a.out.display()))
        .map_err(Failure::Runtime)?;
    let stem = a.out.with_extension("");
    for (row, image) in images.iter().enumerate() {
        let file = PathBuf::from(format!("{}_{row}.png", stem.display()));
        image.save(&file).with_context(|| file.display().to_string()).map_err(Failure::Runtime)?;
    }
    for (n, t) in &cpu {
        println!("{n}: {:?}", t.size());
    }
    Ok(())
}
