//! `flowtune make-tiny flux [--schnell]`: a complete random `FluxPipeline` directory in the exact
//! diffusers layout (loadable by diffusers), for tests and examples.

use std::path::Path;

use flowtune_sampling::SampleRng;
use serde_json::json;
use tch::{Device, Kind};

use super::{FluxTransformer, FluxTransformerConfig};
use crate::sd3::tiny::{
    randomize, write_model, write_scheduler, write_tiny_t5, TinyClip, DIFFUSERS_VERSION,
};
use crate::sd3::WeightInit;
use crate::vae::{AutoencoderKl, VaeConfig};
use crate::{write_json, ModelError};

/// Sizes of a tiny FLUX.1 pipeline.
#[derive(Debug, Clone)]
pub struct TinyFluxSpec {
    pub seed: u64,
    /// Double-stream blocks.
    pub layers: usize,
    /// Single-stream blocks.
    pub single_layers: usize,
    pub heads: i64,
    pub head_dim: i64,
    /// Rotary dimensions per position axis; they sum to `head_dim`.
    pub axes_dims_rope: [i64; 3],
    /// CLIP's width (the transformer's `pooled_projection_dim`).
    pub clip_width: i64,
    /// T5's width (the transformer's `joint_attention_dim`).
    pub t5_width: i64,
    /// VAE channels per level (the VAE downsamples 2^(levels−1)).
    pub vae_channels: Vec<i64>,
    /// [schnell]: no guidance embedding, a fixed shift of 1.
    pub schnell: bool,
    /// The dtype the transformer's weights are written in (a released checkpoint's is bf16).
    pub dtype: Kind,
    /// A real transformer config (e.g. with fewer blocks) used as it is instead of the one the
    /// sizes above build; CLIP and T5 take their widths from it.
    pub transformer: Option<FluxTransformerConfig>,
}

impl Default for TinyFluxSpec {
    fn default() -> Self {
        Self {
            seed: 0,
            layers: 2,
            single_layers: 2,
            heads: 2,
            head_dim: 16,
            axes_dims_rope: [4, 6, 6],
            clip_width: 16,
            t5_width: 32,
            vae_channels: vec![16, 32],
            schnell: false,
            dtype: Kind::Float,
            transformer: None,
        }
    }
}

/// FLUX.1's latent channels.
const LATENT_CHANNELS: i64 = 16;

/// Writes the pipeline into `dir` (created if missing).
pub fn write_tiny_flux(dir: &Path, spec: &TinyFluxSpec) -> Result<(), ModelError> {
    let config = spec.transformer.clone().unwrap_or_else(|| FluxTransformerConfig {
        num_layers: spec.layers,
        num_single_layers: spec.single_layers,
        num_attention_heads: spec.heads,
        attention_head_dim: spec.head_dim,
        axes_dims_rope: spec.axes_dims_rope,
        joint_attention_dim: spec.t5_width,
        pooled_projection_dim: spec.clip_width,
        in_channels: 4 * LATENT_CHANNELS,
        guidance_embeds: !spec.schnell,
        ..Default::default()
    });
    let mut rng = SampleRng::new(spec.seed);
    let init = WeightInit::Normal(0.1);
    let (clip_tok, clip_vocab) = crate::clip::tokenizer::tiny()?;
    let clip = TinyClip {
        tokenizer: &clip_tok,
        vocab: clip_vocab,
        width: config.pooled_projection_dim,
        layers: 2,
        length: 77,
        projection: false,
        pad: "<|endoftext|>",
    };
    clip.write(&dir.join("text_encoder"), &dir.join("tokenizer"), init, &mut rng)?;
    write_tiny_t5(
        &dir.join("text_encoder_2"),
        &dir.join("tokenizer_2"),
        "t5",
        config.joint_attention_dim,
        2,
        init,
        &mut rng,
    )?;

    let transformer = FluxTransformer::new(&config, Device::Cpu, spec.dtype, None)?;
    randomize(&transformer.weights.base, &mut rng, init)?;
    write_model(&dir.join("transformer"), &transformer.weights.base, &config)?;

    write_flux_vae(&dir.join("vae"), &spec.vae_channels, &mut rng, init)?;

    // The released schedulers: [dev] shifts dynamically, [schnell] not at all.
    write_scheduler(
        dir,
        &json!({
            "_class_name": "FlowMatchEulerDiscreteScheduler",
            "_diffusers_version": DIFFUSERS_VERSION,
            "base_image_seq_len": 256,
            "base_shift": 0.5,
            "max_image_seq_len": 4096,
            "max_shift": 1.15,
            "num_train_timesteps": 1000,
            "shift": if spec.schnell { 1.0 } else { 3.0 },
            "use_dynamic_shifting": !spec.schnell
        }),
    )?;
    write_json(
        &dir.join("model_index.json"),
        &json!({
            "_class_name": "FluxPipeline",
            "_diffusers_version": DIFFUSERS_VERSION,
            "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
            "text_encoder": ["transformers", "CLIPTextModel"],
            "text_encoder_2": ["transformers", "T5EncoderModel"],
            "tokenizer": ["transformers", "CLIPTokenizer"],
            "tokenizer_2": ["transformers", "T5TokenizerFast"],
            "transformer": ["diffusers", "FluxTransformer2DModel"],
            "vae": ["diffusers", "AutoencoderKL"],
            "image_encoder": [null, null],
            "feature_extractor": [null, null]
        }),
    )
}

/// FLUX.1's VAE settings (16 channels, scaling and shift factors, no quant convs), tiny and random,
/// written to `out` (Z-Image has the same VAE).
pub(crate) fn write_flux_vae(
    out: &Path,
    block_out_channels: &[i64],
    rng: &mut SampleRng,
    init: WeightInit,
) -> Result<VaeConfig, ModelError> {
    let levels = block_out_channels.len();
    let config = VaeConfig {
        latent_channels: LATENT_CHANNELS,
        block_out_channels: block_out_channels.to_vec(),
        down_block_types: vec!["DownEncoderBlock2D".into(); levels],
        up_block_types: vec!["UpDecoderBlock2D".into(); levels],
        layers_per_block: 1,
        norm_num_groups: 4,
        sample_size: 64,
        scaling_factor: 0.3611,
        shift_factor: Some(0.1159),
        ..Default::default()
    };
    let vae = AutoencoderKl::new(&config, Device::Cpu, Kind::Float)?;
    randomize(&vae.store, rng, init)?;
    write_model(out, &vae.store, &config)?;
    Ok(config)
}
