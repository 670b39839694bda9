//! `flowtune make-tiny wan`: a complete random `WanPipeline` directory in the diffusers layout
//! (Wan2.2-TI2V-style by default: the residual VAE with 2×2 pixel patches and per-token
//! timesteps; Wan2.1-style with `wan21`; Wan2.2-T2V-A14B-style with `two_experts`), loadable and
//! runnable by diffusers.

use std::path::Path;

use flowtune_sampling::SampleRng;
use serde_json::json;
use tch::{Device, Kind};

use super::{AutoencoderKlWan, WanTransformer, WanTransformerConfig, WanVaeConfig};
use crate::sd3::tiny::{randomize, write_model, write_scheduler, write_tiny_t5, DIFFUSERS_VERSION};
use crate::sd3::WeightInit;
use crate::{write_json, ModelError};

/// Sizes of a tiny Wan pipeline.
#[derive(Debug, Clone)]
pub struct TinyWanSpec {
    pub seed: u64,
    pub layers: usize,
    pub heads: i64,
    /// Width of one head (rotary axes: rows and columns `2·(d / 6)` each, frames the rest).
    pub head_dim: i64,
    pub ffn_dim: i64,
    /// Width of the UMT5 text encoder (the transformer's `text_dim`).
    pub text_width: i64,
    pub text_layers: usize,
    /// Wan2.1's VAE (z 16, 8× spatial) and per-sample timesteps instead of Wan2.2-TI2V's.
    pub wan21: bool,
    /// A second expert `transformer_2` (its own random weights) below `boundary_ratio`
    /// [`A14B_BOUNDARY_RATIO`], as Wan2.2-T2V-A14B.
    pub two_experts: bool,
    /// The dtype the transformers' weights are written in (a released checkpoint's is bf16).
    pub dtype: Kind,
    /// A real transformer config (e.g. with fewer blocks) used as it is, for every expert,
    /// instead of the one the sizes above build; UMT5's width is its `text_dim`, the Wan2.2
    /// VAE's latent channels its `in_channels`.
    pub transformer: Option<WanTransformerConfig>,
}

/// Wan2.2-T2V-A14B's `boundary_ratio`: the high-noise expert runs `t ≥ 875`.
pub const A14B_BOUNDARY_RATIO: f64 = 0.875;

impl Default for TinyWanSpec {
    fn default() -> Self {
        Self {
            seed: 0,
            layers: 2,
            heads: 2,
            head_dim: 16,
            ffn_dim: 64,
            text_width: 32,
            text_layers: 2,
            wan21: false,
            two_experts: false,
            dtype: Kind::Float,
            transformer: None,
        }
    }
}

impl WanVaeConfig {
    /// Wan2.1's layout (four levels, temporal downsampling in the last two) at width 4.
    pub fn tiny_wan21() -> Self {
        Self { base_dim: 4, num_res_blocks: 1, dim_mult: vec![1, 2, 2, 2], ..Default::default() }
    }

    /// Wan2.2's layout (residual blocks, 2×2 pixel patches: 12 channels, 16× spatial) at width
    /// 8, z 16 with Wan2.1's statistics.
    pub fn tiny_wan22() -> Self {
        Self {
            base_dim: 8,
            decoder_base_dim: Some(8),
            num_res_blocks: 1,
            dim_mult: vec![1, 2, 2, 2],
            is_residual: true,
            in_channels: 12,
            out_channels: 12,
            patch_size: Some(2),
            scale_factor_spatial: Some(16),
            ..Default::default()
        }
    }
}

/// Writes the pipeline into `dir` (created if missing).
pub fn write_tiny_wan(dir: &Path, spec: &TinyWanSpec) -> Result<(), ModelError> {
    let text_width = spec.transformer.as_ref().map_or(spec.text_width, |t| t.text_dim);
    let mut rng = SampleRng::new(spec.seed);
    let init = WeightInit::Normal(0.1);
    write_tiny_t5(
        &dir.join("text_encoder"),
        &dir.join("tokenizer"),
        "umt5",
        text_width,
        spec.text_layers,
        init,
        &mut rng,
    )?;

    let mut vae = if spec.wan21 { WanVaeConfig::tiny_wan21() } else { WanVaeConfig::tiny_wan22() };
    if let Some(z) = spec.transformer.as_ref().map(|t| t.in_channels).filter(|&z| z != vae.z_dim) {
        // Another latent width (Wan2.2-TI2V-5B's 48): neutral statistics.
        vae = WanVaeConfig {
            z_dim: z,
            latents_mean: vec![0.0; z as usize],
            latents_std: vec![1.0; z as usize],
            ..vae
        };
    }
    AutoencoderKlWan::write_random(&dir.join("vae"), spec.seed + 1, &vae)?;

    let config = spec.transformer.clone().unwrap_or_else(|| WanTransformerConfig {
        num_attention_heads: spec.heads,
        attention_head_dim: spec.head_dim,
        in_channels: vae.z_dim,
        out_channels: Some(vae.z_dim),
        text_dim: spec.text_width,
        ffn_dim: spec.ffn_dim,
        num_layers: spec.layers,
        ..Default::default()
    });
    let experts: &[&str] =
        if spec.two_experts { &["transformer", "transformer_2"] } else { &["transformer"] };
    for name in experts {
        let transformer = WanTransformer::new(&config, Device::Cpu, spec.dtype, None)?;
        randomize(&transformer.weights.base, &mut rng, init)?;
        write_model(&dir.join(name), &transformer.weights.base, &config)?;
    }

    // Wan's UniPC flow-matching scheduler (Wan2.2-TI2V-5B: flow_shift 5).
    write_scheduler(
        dir,
        &json!({
            "_class_name": "UniPCMultistepScheduler",
            "_diffusers_version": DIFFUSERS_VERSION,
            "num_train_timesteps": 1000,
            "prediction_type": "flow_prediction",
            "use_flow_sigmas": true,
            "flow_shift": 5.0,
            "solver_order": 2,
            "solver_type": "bh2",
            "predict_x0": true,
            "lower_order_final": true,
            "final_sigmas_type": "zero",
            "timestep_spacing": "linspace",
            "time_shift_type": "exponential"
        }),
    )?;
    write_json(
        &dir.join("model_index.json"),
        &json!({
            "_class_name": "WanPipeline",
            "_diffusers_version": DIFFUSERS_VERSION,
            "boundary_ratio": spec.two_experts.then_some(A14B_BOUNDARY_RATIO),
            "expand_timesteps": !spec.wan21,
            "scheduler": ["diffusers", "UniPCMultistepScheduler"],
            "text_encoder": ["transformers", "UMT5EncoderModel"],
            "tokenizer": ["transformers", "T5TokenizerFast"],
            "transformer": ["diffusers", "WanTransformer3DModel"],
            "transformer_2": if spec.two_experts {
                json!(["diffusers", "WanTransformer3DModel"])
            } else {
                json!([null, null])
            },
            "vae": ["diffusers", "AutoencoderKLWan"],
        }),
    )
}
