//! `flowtune bench transformer`: forward and forward+backward (LoRA) throughput of a transformer
//! directory, in image tokens per second. Compare with `scripts/bench_transformer_diffusers.py`
//! on the same weights and shapes.

use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, Subcommand};
use flowtune_models::lora::LoraConfig;
use flowtune_models::sd3::Sd3Transformer;
use tch::{Device, Kind, Tensor};

use crate::device::DeviceArg;
use crate::Failure;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Time an SD3 transformer.
    Transformer(TransformerArgs),
    /// Time rollouts (SDE sampling with log-probs, CFG, VAE decode) of a pipeline directory.
    Rollout(RolloutArgs),
    /// The algorithm sandbox: algorithms on the shapes task, accuracy before/after and speed.
    Shapes(super::bench_shapes::ShapesBenchArgs),
}

#[derive(Args)]
pub struct RolloutArgs {
    /// A diffusers pipeline directory.
    #[arg(long)]
    model: PathBuf,
    #[arg(long, default_value_t = 4)]
    batch: usize,
    #[arg(long, default_value_t = 10)]
    steps: usize,
    #[arg(long, default_value_t = 4.5)]
    guidance: f64,
    #[arg(long, default_value_t = 512)]
    resolution: i64,
    /// Timed rollouts (after one warm-up).
    #[arg(long, default_value_t = 3)]
    iters: usize,
}

fn bench_rollout(a: RolloutArgs, device: Device) -> Result<(), Failure> {
    use flowtune_models::sd3::{Dtypes, Sd3Pipeline};
    let pipe = Sd3Pipeline::load(&a.model, device, Dtypes::all(Kind::Float), None)
        .map_err(Failure::input)?;
    let sampler = flowtune_sampling::SamplerConfig {
        n: 1,
        steps: a.steps,
        guidance_scale: a.guidance,
        batch_size: 0,
        ..Default::default()
    };
    sampler.validate().map_err(Failure::input)?;
    let engine = flowtune_trainer::engine::Engine::new(&pipe, &sampler, a.resolution, 0)
        .map_err(Failure::input)?;
    let prompts = vec!["a photo of a red circle next to a blue square"; a.batch];
    let negatives = vec![""; a.batch];
    let mut step = 0u64;
    let seconds = time(a.iters, device, || {
        step += 1;
        engine
            .rollout(&prompts, &negatives, &engine.row_seeds(a.batch, step), step)
            .map(drop)
            .map_err(|e| Failure::Runtime(e.into()))
    })?;
    println!(
        "rollout: batch {} × {} steps at {}px, CFG {}, on {:?}: {:.1} ms per batch, {:.2} images/s",
        a.batch,
        a.steps,
        a.resolution,
        a.guidance,
        device,
        seconds * 1e3,
        a.batch as f64 / seconds
    );
    Ok(())
}

#[derive(Args)]
pub struct TransformerArgs {
    /// A transformer directory (config.json + safetensors).
    #[arg(long)]
    component: PathBuf,
    #[arg(long, default_value_t = 2)]
    batch: i64,
    /// Latent height and width.
    #[arg(long, default_value_t = 64)]
    latent: i64,
    /// Text tokens.
    #[arg(long, default_value_t = 77)]
    text_len: i64,
    /// Timed iterations (after one warm-up).
    #[arg(long, default_value_t = 5)]
    iters: usize,
    /// LoRA rank for the backward timing.
    #[arg(long, default_value_t = 32)]
    lora_rank: i64,
    /// bf16 | f32
    #[arg(long, default_value = "f32")]
    dtype: String,
}

fn time(
    iters: usize,
    device: Device,
    mut f: impl FnMut() -> Result<(), Failure>,
) -> Result<f64, Failure> {
    f()?;
    let sync = || {
        if let Device::Cuda(i) = device {
            tch::Cuda::synchronize(i as i64);
        }
    };
    sync();
    let start = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    sync();
    Ok(start.elapsed().as_secs_f64() / iters as f64)
}

pub fn run(command: BenchCommand, device: &DeviceArg) -> Result<(), Failure> {
    let device = device.resolve()?;
    let a = match command {
        BenchCommand::Transformer(a) => a,
        BenchCommand::Rollout(a) => return bench_rollout(a, device),
        BenchCommand::Shapes(a) => return super::bench_shapes::run(a, device),
    };
    let kind = match a.dtype.as_str() {
        "f32" => Kind::Float,
        "bf16" => Kind::BFloat16,
        other => {
            return Err(Failure::input(anyhow::anyhow!("--dtype {other}: expected f32 or bf16")))
        }
    };
    let lora =
        LoraConfig { rank: a.lora_rank, alpha: 2.0 * a.lora_rank as f64, ..Default::default() };
    let model =
        Sd3Transformer::load(&a.component, device, kind, Some(&lora)).map_err(Failure::input)?;
    let c = &model.config;
    tch::manual_seed(0);
    let opts = (kind, device);
    let x = Tensor::randn([a.batch, c.in_channels, a.latent, a.latent], opts);
    let text = Tensor::randn([a.batch, a.text_len, c.joint_attention_dim], opts);
    let pooled = Tensor::randn([a.batch, c.pooled_projection_dim], opts);
    let t = Tensor::full([a.batch], 500.0, (Kind::Float, device));
    let run = || model.forward(&x, &text, &pooled, &t).map_err(Failure::input);
    model.set_adapters_enabled(false);
    let forward = time(a.iters, device, || tch::no_grad(|| run().map(drop)))?;
    model.set_adapters_enabled(true);
    let backward = time(a.iters, device, || {
        run()?.to_kind(Kind::Float).square().mean(Kind::Float).backward();
        Ok(())
    })?;
    let tokens = (a.batch * (a.latent / c.patch_size) * (a.latent / c.patch_size)) as f64;
    println!(
        "transformer {} layers × {} dim, batch {} × {}² latents, {} text tokens, {:?} on {:?}",
        c.num_layers,
        c.inner_dim(),
        a.batch,
        a.latent,
        a.text_len,
        kind,
        device
    );
    println!(
        "forward:               {:8.1} ms  {:10.0} image tokens/s",
        forward * 1e3,
        tokens / forward
    );
    println!(
        "forward+backward LoRA: {:8.1} ms  {:10.0} image tokens/s",
        backward * 1e3,
        tokens / backward
    );
    Ok(())
}
