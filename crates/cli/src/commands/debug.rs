//! `flowtune debug …`: inspection tools for the math.

use std::path::PathBuf;

use clap::Subcommand;
use flowtune_models::lora::LoraConfig;
use flowtune_models::Dtype;
use flowtune_sampling::{GridRequest, Pipeline, SchedulerConfig, SigmaGrid};
use serde_json::json;

use crate::device::DeviceArg;
use crate::Failure;

#[derive(Subcommand)]
pub enum DebugCommand {
    /// Run one component (transformer, VAE decoder, CLIP, T5) on `input.*` tensors, write `output.*`.
    Forward {
        /// A component directory (config.json + safetensors).
        #[arg(long)]
        component: PathBuf,
        /// Safetensors with the inputs, named like the fixtures (`input.hidden_states`, …).
        #[arg(long)]
        inputs: PathBuf,
        /// Where to write the outputs.
        #[arg(long)]
        out: PathBuf,
        /// A LoRA file in the diffusers/PEFT layout to apply (transformers only).
        #[arg(long)]
        lora: Option<PathBuf>,
        /// LoRA alpha, for files without diffusers' adapter metadata (default: the rank).
        #[arg(long, requires = "lora")]
        lora_alpha: Option<f64>,
        /// A denoiser's dtype (f32 | bf16 | f16); its activations go in that dtype, outputs come
        /// back as f32. Other components run in f32.
        #[arg(long, default_value = "f32", value_parser = super::bench_common::parse_dtype)]
        dtype: Dtype,
        /// Compares every output with the inputs file's tensor of the same name (a fixture's
        /// `output.*`): fails when ‖out − expected‖ / ‖expected‖ exceeds this.
        #[arg(long)]
        check: Option<f64>,
    },
    /// Write random LoRA adapters for a denoiser directory of any family (diffusers/PEFT layout).
    MakeLora {
        #[arg(long)]
        component: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 4)]
        rank: i64,
        #[arg(long, default_value_t = 8.0)]
        alpha: f64,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Adapted layers, comma-separated (PEFT's names; `all-linear` for every linear layer).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "attn.to_q,attn.to_k,attn.to_v,attn.to_out.0,attn.add_q_proj,attn.add_k_proj,attn.add_v_proj,attn.to_add_out"
        )]
        target_modules: Vec<String>,
    },
    /// Run one trajectory (any family) from given initial latents and per-step noise; write its
    /// latents, log-probs, timesteps and decoded pictures.
    Rollout(super::debug_rollout::RolloutArgs),
    /// Print the sigma grid of a diffusers scheduler config as JSON {sigmas, timesteps, mu}.
    Schedule {
        /// A diffusers `scheduler_config.json` (FlowMatchEulerDiscreteScheduler).
        #[arg(long)]
        scheduler_config: PathBuf,
        /// Number of denoising steps N.
        #[arg(long, required_unless_present = "sigmas")]
        steps: Option<usize>,
        /// Packed image tokens, for dynamic shifting: (H/16)·(W/16) for 8× VAEs with 2×2 patches.
        #[arg(long)]
        image_seq_len: Option<u64>,
        /// Whose `set_timesteps` call to reproduce.
        #[arg(long, default_value = "sd3", value_parser = parse_pipeline)]
        pipeline: Pipeline,
        /// Explicit sigmas, comma-separated, instead of the pipeline's own (N = their count).
        #[arg(long, value_delimiter = ',', conflicts_with = "steps")]
        sigmas: Option<Vec<f64>>,
        /// Also look this timestep up on the grid (exact match), as the trainer does.
        #[arg(long)]
        timestep: Option<f32>,
    },
}

fn parse_pipeline(text: &str) -> Result<Pipeline, String> {
    Pipeline::parse(text).map_err(|e| e.to_string())
}

pub fn run(command: DebugCommand, device: &DeviceArg) -> Result<(), Failure> {
    match command {
        DebugCommand::Forward { component, inputs, out, lora, lora_alpha, dtype, check } => {
            let lora = lora.as_deref().map(|f| (f, lora_alpha));
            let device = device.resolve()?;
            let run = super::forward::Run { lora, device, kind: dtype.kind(), check };
            super::forward::forward(&component, &inputs, &out, &run)
        }
        DebugCommand::MakeLora { component, out, rank, alpha, seed, target_modules } => {
            let config = LoraConfig { rank, alpha, target_modules, ..Default::default() };
            super::forward::make_lora(&component, &out, &config, seed)
        }
        DebugCommand::Rollout(args) => super::debug_rollout::rollout(args, device),
        DebugCommand::Schedule {
            scheduler_config,
            steps,
            image_seq_len,
            pipeline,
            sigmas,
            timestep,
        } => {
            let config = SchedulerConfig::from_file(&scheduler_config).map_err(Failure::input)?;
            let steps = steps.unwrap_or_default();
            let request = GridRequest { steps, pipeline, image_seq_len, sigmas };
            let grid = SigmaGrid::new(&config, &request).map_err(Failure::input)?;
            let mut out =
                json!({ "sigmas": grid.sigmas, "timesteps": grid.timesteps, "mu": grid.mu });
            if let Some(t) = timestep {
                let index = grid.index_of(t).map_err(Failure::input)?;
                out["lookup"] = json!({
                    "timestep": t,
                    "index": index,
                    "sigma": grid.sigmas[index],
                    "sigma_next": grid.sigmas[index + 1],
                });
            }
            println!("{}", serde_json::to_string_pretty(&out).expect("JSON of numbers"));
            Ok(())
        }
    }
}
