//! `flowtune make-tiny flux2`: a complete random `Flux2KleinPipeline` ([klein]) or `Flux2Pipeline`
//! ([dev]) directory in the exact diffusers layout (loadable by diffusers), for tests and examples.

use std::path::Path;

use flowtune_sampling::SampleRng;
use serde_json::json;
use tch::{Device, Kind, Tensor};

use super::pipeline::{MISTRAL_TEXT_LAYERS, SYSTEM_MESSAGE, TEXT_LAYERS};
use super::{Flux2Transformer, Flux2TransformerConfig, Flux2Vae, Flux2VaeConfig};
use crate::sd3::tiny::{randomize, write_model, write_scheduler, DIFFUSERS_VERSION};
use crate::sd3::WeightInit;
use crate::text_encoders::mistral3_tiny::write_mistral3;
use crate::text_encoders::qwen_decoder::DecoderShape;
use crate::z_image::tiny::write_qwen3;
use crate::{write_json, ModelError};

/// Sizes of a tiny FLUX.2 pipeline.
#[derive(Debug, Clone)]
pub struct TinyFlux2Spec {
    pub seed: u64,
    /// Double-stream blocks.
    pub layers: usize,
    /// Single-stream blocks.
    pub single_layers: usize,
    pub heads: i64,
    pub head_dim: i64,
    /// Rotary dimensions per position axis (4); they sum to `head_dim`.
    pub axes_dims_rope: Vec<i64>,
    /// The Qwen3 text encoder of [klein] (at least 27 layers: the pipeline reads layers 9, 18 and
    /// 27); [dev]'s Mistral gets its width and heads with 30 layers, no head norms and rope θ 1e9.
    pub text: DecoderShape,
    /// Byte-level BPE vocabulary of the tokenizer before the added tokens.
    pub bpe_vocab_size: usize,
    /// VAE channels per level (the VAE downsamples 2^(levels−1)).
    pub vae_channels: Vec<i64>,
    pub vae_latent_channels: i64,
    /// `is_distilled` of `model_index.json`: no CFG.
    pub distilled: bool,
    /// FLUX.2 [dev]: `Flux2Pipeline` with a Mistral3 text encoder and a guidance embedding.
    pub dev: bool,
    /// The dtype the transformer's weights are written in (a released checkpoint's is bf16).
    pub dtype: Kind,
    /// A real transformer config (e.g. with fewer blocks) used as it is instead of the one the
    /// sizes above build; the text encoder's width is a third of its `joint_attention_dim`.
    pub transformer: Option<Flux2TransformerConfig>,
}

impl Default for TinyFlux2Spec {
    fn default() -> Self {
        Self {
            seed: 0,
            layers: 1,
            single_layers: 2,
            heads: 2,
            head_dim: 16,
            axes_dims_rope: vec![4, 4, 4, 4],
            text: DecoderShape {
                vocab_size: 0,
                hidden_size: 16,
                intermediate_size: 24,
                num_hidden_layers: TEXT_LAYERS[2],
                num_attention_heads: 2,
                num_key_value_heads: 1,
                head_dim: 8,
                rms_norm_eps: 1e-6,
                rope_theta: 1e6,
                qkv_bias: false,
                qk_norm: true,
            },
            bpe_vocab_size: 400,
            vae_channels: vec![8, 16],
            vae_latent_channels: 8,
            distilled: false,
            dev: false,
            dtype: Kind::Float,
            transformer: None,
        }
    }
}

/// Writes the pipeline into `dir` (created if missing).
pub fn write_tiny_flux2(dir: &Path, spec: &TinyFlux2Spec) -> Result<(), ModelError> {
    let mut rng = SampleRng::new(spec.seed);
    let layers = TEXT_LAYERS.len() as i64;
    let hidden_size =
        spec.transformer.as_ref().map_or(spec.text.hidden_size, |t| t.joint_attention_dim / layers);
    let text = DecoderShape { hidden_size, ..spec.text.clone() };
    let text = if spec.dev {
        let mistral = DecoderShape {
            num_hidden_layers: MISTRAL_TEXT_LAYERS[2],
            rms_norm_eps: 1e-5,
            rope_theta: 1e9,
            qk_norm: false,
            ..text
        };
        write_mistral3(dir, &mistral, spec.bpe_vocab_size, SYSTEM_MESSAGE, &mut rng)?
    } else {
        write_qwen3(dir, &text, spec.bpe_vocab_size, true, &mut rng)?
    };

    let vae = write_flux2_vae(&dir.join("vae"), spec, &mut rng)?;

    let config = spec.transformer.clone().unwrap_or_else(|| Flux2TransformerConfig {
        in_channels: 4 * vae.latent_channels,
        num_layers: spec.layers,
        num_single_layers: spec.single_layers,
        attention_head_dim: spec.head_dim,
        num_attention_heads: spec.heads,
        joint_attention_dim: layers * text.hidden_size,
        timestep_guidance_channels: 32,
        axes_dims_rope: spec.axes_dims_rope.clone(),
        guidance_embeds: spec.dev,
        ..Default::default()
    });
    let transformer = Flux2Transformer::new(&config, Device::Cpu, spec.dtype, None)?;
    randomize(&transformer.weights.base, &mut rng, WeightInit::Normal(0.1))?;
    write_model(&dir.join("transformer"), &transformer.weights.base, &config)?;

    // The released FLUX.2 scheduler: dynamic shifting with the pipeline's empirical μ.
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
            "shift": 3.0,
            "time_shift_type": "exponential",
            "use_dynamic_shifting": true
        }),
    )?;
    let index = if spec.dev {
        json!({
            "_class_name": "Flux2Pipeline",
            "_diffusers_version": DIFFUSERS_VERSION,
            "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
            "text_encoder": ["transformers", "Mistral3ForConditionalGeneration"],
            "tokenizer": ["transformers", "PixtralProcessor"],
            "transformer": ["diffusers", "Flux2Transformer2DModel"],
            "vae": ["diffusers", "AutoencoderKLFlux2"]
        })
    } else {
        json!({
            "_class_name": "Flux2KleinPipeline",
            "_diffusers_version": DIFFUSERS_VERSION,
            "is_distilled": spec.distilled,
            "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
            "text_encoder": ["transformers", "Qwen3ForCausalLM"],
            "tokenizer": ["transformers", "Qwen2Tokenizer"],
            "transformer": ["diffusers", "Flux2Transformer2DModel"],
            "vae": ["diffusers", "AutoencoderKLFlux2"]
        })
    };
    write_json(&dir.join("model_index.json"), &index)
}

/// A random `AutoencoderKLFlux2` (positive running variances) with `bn.num_batches_tracked`.
fn write_flux2_vae(
    out: &Path,
    spec: &TinyFlux2Spec,
    rng: &mut SampleRng,
) -> Result<Flux2VaeConfig, ModelError> {
    let levels = spec.vae_channels.len();
    let config = Flux2VaeConfig {
        block_out_channels: spec.vae_channels.clone(),
        down_block_types: vec!["DownEncoderBlock2D".into(); levels],
        up_block_types: vec!["UpDecoderBlock2D".into(); levels],
        // A real transformer config reads 2×2 patches of its own latent width.
        latent_channels: spec
            .transformer
            .as_ref()
            .map_or(spec.vae_latent_channels, |t| t.in_channels / 4),
        layers_per_block: 1,
        norm_num_groups: 4,
        sample_size: 64,
        ..Default::default()
    };
    let vae = Flux2Vae::new(&config, Device::Cpu, Kind::Float)?;
    randomize(&vae.autoencoder.store, rng, WeightInit::Normal(0.1))?;
    tch::no_grad(|| {
        let var = vae.running_var.abs() + 0.5;
        vae.running_var.shallow_clone().copy_(&var);
    });
    write_model(out, &vae.autoencoder.store, &config)?;
    let file = out.join("diffusion_pytorch_model.safetensors");
    let mut tensors = Tensor::read_safetensors(&file)?;
    tensors.push(("bn.num_batches_tracked".into(), Tensor::from(0i64)));
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Tensor::write_safetensors(&tensors, &file).map(|_| config)?)
}
