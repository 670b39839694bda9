//! `flowtune make-tiny z_image`: a complete random `ZImagePipeline` directory in the exact
//! diffusers layout (loadable by diffusers), for tests and examples.

use std::path::Path;

use flowtune_sampling::SampleRng;
use serde_json::json;
use tch::{Device, Kind, Tensor};

use super::{ZImageTransformer, ZImageTransformerConfig};
use crate::flux::tiny::write_flux_vae;
use crate::sd3::tiny::{
    randomize, write_component, write_model, write_scheduler, DIFFUSERS_VERSION,
};
use crate::sd3::WeightInit;
use crate::text_encoders::qwen3::Qwen3TextEncoder;
use crate::text_encoders::qwen_decoder::DecoderShape;
use crate::text_encoders::qwen_tiny::write_tokenizer;
use crate::tokenizer::qwen2::ADDED_TOKENS;
use crate::{read_config, write_json, ModelError};

/// A Jinja chat template that renders plain messages and the generation prompt as Qwen3's does
/// (an empty `<think>` block only when `enable_thinking` is false).
const QWEN3_CHAT_TEMPLATE: &str = "{%- for message in messages %}{{- '<|im_start|>' + \
    message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endfor %}{%- if \
    add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined \
    and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}";

/// Sizes of a tiny Z-Image pipeline.
#[derive(Debug, Clone)]
pub struct TinyZImageSpec {
    pub seed: u64,
    pub dim: i64,
    pub heads: i64,
    pub layers: usize,
    pub refiner_layers: usize,
    /// Rotary dimensions per axis; they sum to `dim / heads`.
    pub axes_dims: Vec<i64>,
    /// The Qwen3 text encoder (its `hidden_size` is the transformer's `cap_feat_dim`).
    pub text: DecoderShape,
    /// Byte-level BPE vocabulary of the tokenizer before the added tokens.
    pub bpe_vocab_size: usize,
    pub vae_channels: Vec<i64>,
    /// The dtype the transformer's weights are written in (a released checkpoint's is bf16).
    pub dtype: Kind,
    /// A real transformer config (e.g. with fewer main blocks) used as it is instead of the one
    /// the sizes above build; the text encoder's width is its `cap_feat_dim`.
    pub transformer: Option<ZImageTransformerConfig>,
}

impl Default for TinyZImageSpec {
    fn default() -> Self {
        Self {
            seed: 0,
            dim: 64,
            heads: 2,
            layers: 2,
            refiner_layers: 1,
            axes_dims: vec![8, 12, 12],
            text: DecoderShape {
                vocab_size: 0,
                hidden_size: 32,
                intermediate_size: 48,
                num_hidden_layers: 3,
                num_attention_heads: 4,
                num_key_value_heads: 2,
                head_dim: 16,
                rms_norm_eps: 1e-6,
                rope_theta: 1e6,
                qkv_bias: false,
                qk_norm: true,
            },
            bpe_vocab_size: 400,
            vae_channels: vec![8, 16],
            dtype: Kind::Float,
            transformer: None,
        }
    }
}

/// Writes the pipeline into `dir` (created if missing).
pub fn write_tiny_z_image(dir: &Path, spec: &TinyZImageSpec) -> Result<(), ModelError> {
    let mut rng = SampleRng::new(spec.seed);
    let hidden_size = spec.transformer.as_ref().map_or(spec.text.hidden_size, |t| t.cap_feat_dim);
    let text = DecoderShape { hidden_size, ..spec.text.clone() };
    let text = write_qwen3(dir, &text, spec.bpe_vocab_size, false, &mut rng)?;

    let vae_config =
        write_flux_vae(&dir.join("vae"), &spec.vae_channels, &mut rng, WeightInit::Normal(0.1))?;

    let config = spec.transformer.clone().unwrap_or_else(|| ZImageTransformerConfig {
        in_channels: vae_config.latent_channels,
        dim: spec.dim,
        n_layers: spec.layers,
        n_refiner_layers: spec.refiner_layers,
        n_heads: spec.heads,
        n_kv_heads: spec.heads,
        cap_feat_dim: text.hidden_size,
        axes_dims: spec.axes_dims.clone(),
        axes_lens: vec![1024, 64, 64],
        ..Default::default()
    });
    let transformer = ZImageTransformer::new(&config, Device::Cpu, spec.dtype, None)?;
    randomize(&transformer.weights.base, &mut rng, WeightInit::Normal(0.1))?;
    write_model(&dir.join("transformer"), &transformer.weights.base, &config)?;

    // Z-Image-Turbo's scheduler settings: a static shift of 3.
    write_scheduler(
        dir,
        &json!({
            "_class_name": "FlowMatchEulerDiscreteScheduler",
            "_diffusers_version": DIFFUSERS_VERSION,
            "num_train_timesteps": 1000,
            "shift": 3.0,
            "use_dynamic_shifting": false
        }),
    )?;
    write_json(
        &dir.join("model_index.json"),
        &json!({
            "_class_name": "ZImagePipeline",
            "_diffusers_version": DIFFUSERS_VERSION,
            "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
            "text_encoder": ["transformers", "Qwen3Model"],
            "tokenizer": ["transformers", "Qwen2Tokenizer"],
            "transformer": ["diffusers", "ZImageTransformer2DModel"],
            "vae": ["diffusers", "AutoencoderKL"],
        }),
    )
}

/// A Qwen2 tokenizer (`tokenizer/`, with Qwen3's chat template) and a random `Qwen3Model` of
/// `text`'s sizes (`text_encoder/`) in `dir`, or with `causal` a `Qwen3ForCausalLM` (keys under
/// `model.`, an untied zero `lm_head`); returns the shape with the tokenizer's vocabulary.
pub(crate) fn write_qwen3(
    dir: &Path,
    text: &DecoderShape,
    bpe_vocab_size: usize,
    causal: bool,
    rng: &mut SampleRng,
) -> Result<DecoderShape, ModelError> {
    let tokenizer = dir.join("tokenizer");
    let base_vocab = write_tokenizer(&tokenizer, bpe_vocab_size)?;
    let config_file = tokenizer.join("tokenizer_config.json");
    let mut tokenizer_config: serde_json::Value = read_config(&config_file)?;
    tokenizer_config["chat_template"] = json!(QWEN3_CHAT_TEMPLATE);
    write_json(&config_file, &tokenizer_config)?;
    let text =
        DecoderShape { vocab_size: (base_vocab + ADDED_TOKENS.len()) as i64, ..text.clone() };
    let encoder = Qwen3TextEncoder::new(&text, Device::Cpu, Kind::Float);
    randomize(&encoder.store, rng, WeightInit::Normal(0.1))?;
    let out = dir.join("text_encoder");
    let mut config = qwen3_config(&text, base_vocab);
    write_component(&out, &encoder.store, "model.safetensors", &config)?;
    if causal {
        let file = out.join("model.safetensors");
        let mut tensors: Vec<(String, Tensor)> = Tensor::read_safetensors(&file)?
            .into_iter()
            .map(|(name, t)| (format!("model.{name}"), t))
            .collect();
        tensors.push((
            "lm_head.weight".into(),
            Tensor::zeros([text.vocab_size, text.hidden_size], (Kind::Float, Device::Cpu)),
        ));
        Tensor::write_safetensors(&tensors, &file)?;
        config["architectures"] = json!(["Qwen3ForCausalLM"]);
        write_json(&out.join("config.json"), &config)?;
    }
    Ok(text)
}

/// `config.json` of a `Qwen3Model`.
fn qwen3_config(s: &DecoderShape, base: usize) -> serde_json::Value {
    json!({
        "architectures": ["Qwen3Model"],
        "attention_bias": false,
        "attention_dropout": 0.0,
        "bos_token_id": base,
        "eos_token_id": base + 2,
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "hidden_size": s.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": s.intermediate_size,
        "max_position_embeddings": 40960,
        "max_window_layers": s.num_hidden_layers,
        "model_type": "qwen3",
        "num_attention_heads": s.num_attention_heads,
        "num_hidden_layers": s.num_hidden_layers,
        "num_key_value_heads": s.num_key_value_heads,
        "rms_norm_eps": s.rms_norm_eps,
        "rope_parameters": {"rope_theta": s.rope_theta, "rope_type": "default"},
        "tie_word_embeddings": false,
        "torch_dtype": "float32",
        "use_cache": true,
        "use_sliding_window": false,
        "vocab_size": s.vocab_size
    })
}
