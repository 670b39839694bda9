//! `flowtune bench transformer`: forward and forward+backward (LoRA) throughput of a transformer
//! directory, in image tokens per second (compare with `scripts/bench_transformer_diffusers.py` on
//! the same weights and shapes); `bench rollout`, and the dispatch to `bench shapes`,
//! `bench reward`, `bench load` and `bench step`.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use flowtune_models::lora::LoraConfig;
use flowtune_models::{Dtype, Dtypes, ExampleShape, PipelineOptions, RandomWeights};
use flowtune_rollout::Engine;
use tch::{Device, Kind};

use super::bench_common::{parse_dtype, time};
use crate::device::DeviceArg;
use crate::Failure;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Time a denoiser component (any registered family's transformer).
    Transformer(TransformerArgs),
    /// Time rollouts (SDE sampling with log-probs, CFG, VAE decode) of a pipeline directory.
    Rollout(RolloutArgs),
    /// The algorithm sandbox: algorithms on the shapes task, accuracy before/after and speed.
    Shapes(super::bench_shapes::ShapesBenchArgs),
    /// Time a reward on made-up images: images scored per second.
    Reward(super::bench_reward::RewardArgs),
    /// Memory of loading a transformer directory: weights, resident peak, GPU peak (JSON).
    Load(super::bench_load::LoadArgs),
    /// Whole training steps of a recipe: seconds per phase, images/s per GPU, MFU of rollout and
    /// update, peak memory beside the plan (JSON with `--json`).
    Step(super::bench_step::StepArgs),
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
    /// Pixel frames of a video pipeline's samples (Wan: 4k + 1; its default 81 when absent).
    #[arg(long)]
    num_frames: Option<usize>,
    /// The transformer's dtype (f32 | bf16 | f16); the text encoders and the VAE run in f32.
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    dtype: Dtype,
    /// Seeded random weights from the configs alone, prompts as stand-in embeddings of this many
    /// tokens (see `bench step --random-weights`).
    #[arg(long, value_name = "TEXT_TOKENS")]
    random_weights: Option<i64>,
}

fn bench_rollout(a: RolloutArgs, device: Device) -> Result<(), Failure> {
    let options = PipelineOptions {
        num_frames: a.num_frames,
        dtypes: Dtypes { transformer: a.dtype.kind(), ..Dtypes::all(Kind::Float) },
        random: a.random_weights.map(|text_tokens| RandomWeights { seed: 0, text_tokens }),
        ..PipelineOptions::new(device)
    };
    let pipe = flowtune_models::load_pipeline(&a.model, &options).map_err(Failure::input)?;
    let sampler = flowtune_sampling::SamplerConfig {
        n: 1,
        steps: a.steps,
        guidance_scale: a.guidance,
        batch_size: 0,
        ..Default::default()
    };
    sampler.validate().map_err(Failure::input)?;
    let latent_shape = pipe
        .latent_shape(a.resolution, a.resolution)
        .map_err(|e| Failure::input(anyhow::anyhow!("--resolution {e}")))?;
    let frames = match latent_shape.as_slice() {
        [_, _, _, _] => format!(", {} frames", pipe.decoded_frames(&latent_shape)),
        _ => String::new(),
    };
    let engine = Engine::new(pipe.as_ref(), &sampler, latent_shape, 0).map_err(Failure::input)?;
    let prompts = vec!["a photo of a red circle next to a blue square"; a.batch];
    let negatives = vec![pipe.default_negative_prompt(); a.batch];
    let mut step = 0u64;
    let seconds = time(a.iters, device, || {
        step += 1;
        engine
            .rollout(&prompts, &negatives, &[], &engine.row_seeds(a.batch, step), step)
            .map(drop)
            .map_err(|e| Failure::Runtime(e.into()))
    })?;
    println!(
        "rollout: batch {} × {} steps at {}px{frames}, CFG {}, on {:?}: {:.1} ms per batch, \
         {:.2} samples/s",
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
    /// Latent frames (video transformers such as Wan's; pictures have one).
    #[arg(long, default_value_t = 1)]
    frames: i64,
    /// Text tokens.
    #[arg(long, default_value_t = 77)]
    text_len: i64,
    /// Timed iterations (after one warm-up).
    #[arg(long, default_value_t = 5)]
    iters: usize,
    /// LoRA rank for the backward timing.
    #[arg(long, default_value_t = 32)]
    lora_rank: i64,
    /// Adapted layers, comma-separated (the family's own list when absent, e.g. Z-Image's
    /// to_q,to_k,to_v,to_out.0,feed_forward.w1,feed_forward.w2,feed_forward.w3).
    #[arg(long, value_delimiter = ',')]
    lora_targets: Vec<String>,
    /// f32 | bf16 | f16
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    dtype: Dtype,
    /// Seeded random weights: the component's `config.json` is enough.
    #[arg(long)]
    random_weights: bool,
}

pub fn run(command: BenchCommand, device: &DeviceArg) -> Result<(), Failure> {
    let device = device.resolve()?;
    let a = match command {
        BenchCommand::Transformer(a) => a,
        BenchCommand::Rollout(a) => return bench_rollout(a, device),
        BenchCommand::Shapes(a) => return super::bench_shapes::run(a, device),
        BenchCommand::Reward(a) => return super::bench_reward::run(a),
        BenchCommand::Load(a) => return super::bench_load::run(a, device),
        BenchCommand::Step(a) => return super::bench_step::run(a, &DeviceArg(device)),
    };
    let kind = a.dtype.kind();
    let family = flowtune_models::denoiser_family(&a.component).map_err(Failure::input)?;
    let target_modules = if a.lora_targets.is_empty() {
        family.lora_targets.iter().map(|t| t.to_string()).collect()
    } else {
        a.lora_targets
    };
    let lora = LoraConfig {
        rank: a.lora_rank,
        alpha: 2.0 * a.lora_rank as f64,
        target_modules,
        ..Default::default()
    };
    let load = || (family.load_denoiser)(&a.component, device, kind, Some(&lora));
    let model = match a.random_weights {
        true => flowtune_models::with_random_weights(0, load),
        false => load(),
    }
    .map_err(Failure::input)?;
    tch::manual_seed(0);
    let shape = ExampleShape {
        batch: a.batch,
        frames: a.frames,
        height: a.latent,
        width: a.latent,
        text_len: a.text_len,
    };
    let inputs = model.example_inputs(shape);
    if a.frames > 1 && inputs.latents.dim() < 5 {
        return Err(Failure::input(anyhow::anyhow!(
            "--frames {}: {} samples pictures (one frame); --frames is for video transformers",
            a.frames,
            model.describe()
        )));
    }
    let run =
        || model.velocity(&inputs.latents, &inputs.timestep, &inputs.text).map_err(Failure::input);
    model.set_adapters_enabled(false);
    let forward = time(a.iters, device, || tch::no_grad(|| run().map(drop)))?;
    model.set_adapters_enabled(true);
    let backward = time(a.iters, device, || {
        run()?.to_kind(tch::Kind::Float).square().mean(tch::Kind::Float).backward();
        Ok(())
    })?;
    let tokens = inputs.tokens as f64;
    let frames = match inputs.latents.size().as_slice() {
        [_, _, f, _, _] => format!("{f} frames × "),
        _ => String::new(),
    };
    println!(
        "{}, batch {} × {frames}{}² latents, {} text tokens, {:?} on {:?}",
        model.describe(),
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
