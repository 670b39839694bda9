//! `flowtune make-tiny qwen-image21`: a random `QwenImage21Pipeline` directory in the diffusers
//! layout, for tests and examples. The text encoder is a `Qwen3VLForConditionalGeneration` with
//! the language model's and a one-block vision tower's weights (what flowtune runs; transformers
//! initialises the missing LM head at random when it loads the folder).

use std::path::Path;

use flowtune_sampling::SampleRng;
use serde_json::json;
use tch::{Device, Kind, Tensor};

use super::{
    write_tiny_qwen_image21_vae, QwenImage21Transformer, QwenImage21TransformerConfig,
    QwenImage21VaeConfig,
};
use crate::sd3::tiny::{
    randomize, write_component, write_model, write_scheduler, DIFFUSERS_VERSION,
};
use crate::sd3::WeightInit;
use crate::text_encoders::qwen3::Qwen3TextEncoder;
use crate::text_encoders::qwen3_vl_vision::{Qwen3VlVision, Qwen3VlVisionConfig};
use crate::text_encoders::qwen_decoder::DecoderShape;
use crate::text_encoders::qwen_tiny::write_tokenizer;
use crate::tokenizer::qwen2::ADDED_TOKENS;
use crate::{write_json, ModelError};

/// Qwen3-VL's rendering of chat turns (the system turn the pipeline tokenizes to find how many
/// tokens to drop), for the processor's `chat_template.jinja`.
const CHAT_TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n\
{% if message['content'] is string %}{{ message['content'] }}{% else %}\
{% for c in message['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}\
{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Sizes of a tiny Qwen-Image 2.1 pipeline.
#[derive(Debug, Clone)]
pub struct TinyQwenImage21Spec {
    pub seed: u64,
    pub layers: usize,
    pub heads: i64,
    pub head_dim: i64,
    /// Rotary dimensions (frame, row, column); they sum to `head_dim`.
    pub axes_dims_rope: [i64; 3],
    /// The language model (its width is the transformer's `context_in_dim`).
    pub text: DecoderShape,
    /// Byte-level BPE vocabulary of the tokenizer before the added tokens.
    pub bpe_vocab_size: usize,
    /// Latent channels of the VAE and the transformer.
    pub latent_channels: i64,
    /// `sample_sigmas` of `model_index.json` (`None`: the pipeline's linspace).
    pub sample_sigmas: Option<Vec<f64>>,
}

impl Default for TinyQwenImage21Spec {
    fn default() -> Self {
        Self {
            seed: 0,
            layers: 2,
            heads: 2,
            head_dim: 16,
            axes_dims_rope: [4, 6, 6],
            text: DecoderShape {
                vocab_size: 0,
                hidden_size: 24,
                intermediate_size: 32,
                num_hidden_layers: 2,
                num_attention_heads: 2,
                num_key_value_heads: 1,
                head_dim: 12,
                rms_norm_eps: 1e-6,
                rope_theta: 5e6,
                qkv_bias: false,
                qk_norm: true,
            },
            bpe_vocab_size: 400,
            latent_channels: 16,
            sample_sigmas: Some(vec![1.0, 0.8, 0.55, 0.3]),
        }
    }
}

/// Writes the pipeline into `dir` (created if missing).
pub fn write_tiny_qwen_image21(dir: &Path, spec: &TinyQwenImage21Spec) -> Result<(), ModelError> {
    let mut rng = SampleRng::new(spec.seed);
    let base = write_processor(&dir.join("processor"), spec.bpe_vocab_size)?;
    let text = DecoderShape { vocab_size: (base + ADDED_TOKENS.len()) as i64, ..spec.text.clone() };
    write_text_encoder(&dir.join("text_encoder"), &text, base, &mut rng, spec.seed)?;

    let config = QwenImage21TransformerConfig {
        in_channels: spec.latent_channels,
        out_channels: Some(spec.latent_channels),
        num_layers: spec.layers,
        attention_head_dim: spec.head_dim,
        num_attention_heads: spec.heads,
        context_in_dim: text.hidden_size,
        axes_dims_rope: spec.axes_dims_rope,
        ..Default::default()
    };
    let transformer = QwenImage21Transformer::new(&config, Device::Cpu, Kind::Float, None)?;
    randomize(&transformer.weights.base, &mut rng, WeightInit::Normal(0.1))?;
    write_model(&dir.join("transformer"), &transformer.weights.base, &config)?;
    let vae = QwenImage21VaeConfig::tiny(spec.latent_channels);
    write_tiny_qwen_image21_vae(&dir.join("vae"), spec.seed + 1, &vae)?;

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
            "shift": 1.0,
            "time_shift_type": "exponential",
            "use_dynamic_shifting": true
        }),
    )?;
    write_json(
        &dir.join("model_index.json"),
        &json!({
            "_class_name": "QwenImage21Pipeline",
            "_diffusers_version": DIFFUSERS_VERSION,
            "processor": ["transformers", "Qwen3VLProcessor"],
            "sample_sigmas": spec.sample_sigmas,
            "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
            "text_encoder": ["transformers", "Qwen3VLForConditionalGeneration"],
            "transformer": ["diffusers", "QwenImage21Transformer2DModel"],
            "vae": ["diffusers", "AutoencoderKLQwenImage21"]
        }),
    )
}

/// The tokenizer, chat template and image/video processor settings of a `Qwen3VLProcessor`;
/// returns the BPE vocabulary size before the added tokens.
fn write_processor(out: &Path, bpe_vocab_size: usize) -> Result<usize, ModelError> {
    let base = write_tokenizer(out, bpe_vocab_size)?;
    std::fs::write(out.join("chat_template.jinja"), CHAT_TEMPLATE)
        .map_err(|e| ModelError::Io { path: out.display().to_string(), message: e.to_string() })?;
    let vision = json!({
        "do_convert_rgb": true, "do_normalize": true, "do_rescale": true, "do_resize": true,
        "merge_size": 2, "patch_size": 16, "resample": 3,
        "rescale_factor": 0.00392156862745098, "temporal_patch_size": 2,
    });
    let mut image = vision.clone();
    image["image_processor_type"] = json!("Qwen2VLImageProcessor");
    image["image_mean"] = json!([0.5, 0.5, 0.5]);
    image["image_std"] = json!([0.5, 0.5, 0.5]);
    // Pixel bounds that take the tiny pipelines' condition pictures (from 32²) as they are.
    image["size"] = json!({"longest_edge": 16777216, "shortest_edge": 1024});
    let mut video = image.clone();
    video["video_processor_type"] = json!("Qwen3VLVideoProcessor");
    video["fps"] = json!(2);
    video["do_sample_frames"] = json!(true);
    video["size"] = json!({"longest_edge": 25165824, "shortest_edge": 4096});
    write_json(
        &out.join("processor_config.json"),
        &json!({"image_processor": image, "processor_class": "Qwen3VLProcessor", "video_processor": video}),
    )?;
    Ok(base)
}

/// A random language model under `model.language_model.` and a one-block vision tower under
/// `model.visual.` (drawn from its own stream seeded `seed + 2`, so the other components are those
/// of the text-only pipelines), with their `Qwen3VLForConditionalGeneration` config.
fn write_text_encoder(
    out: &Path,
    text: &DecoderShape,
    base: usize,
    rng: &mut SampleRng,
    seed: u64,
) -> Result<(), ModelError> {
    let encoder = Qwen3TextEncoder::new(text, Device::Cpu, Kind::Float);
    randomize(&encoder.store, rng, WeightInit::Normal(0.1))?;
    let vision_config = Qwen3VlVisionConfig {
        depth: 1,
        hidden_size: 16,
        intermediate_size: 16,
        num_heads: 2,
        out_hidden_size: text.hidden_size,
        deepstack_visual_indexes: vec![0],
        num_position_embeddings: 16,
        ..Default::default()
    };
    let vision = Qwen3VlVision::new(&vision_config, Device::Cpu, Kind::Float);
    randomize(&vision.store, &mut SampleRng::new(seed + 2), WeightInit::Normal(0.1))?;
    let v = &vision_config;
    let token = |name: &str| base + ADDED_TOKENS.iter().position(|t| *t == name).expect("added");
    let half = text.head_dim / 2;
    let section = [half - 2 * (half / 3), half / 3, half / 3];
    let config = json!({
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "image_token_id": token("<|image_pad|>"),
        "video_token_id": token("<|video_pad|>"),
        "vision_start_token_id": token("<|vision_start|>"),
        "vision_end_token_id": token("<|vision_end|>"),
        "tie_word_embeddings": false,
        "text_config": {
            "model_type": "qwen3_vl_text",
            "attention_bias": false,
            "attention_dropout": 0.0,
            "head_dim": text.head_dim,
            "hidden_act": "silu",
            "hidden_size": text.hidden_size,
            "intermediate_size": text.intermediate_size,
            "max_position_embeddings": 4096,
            "num_attention_heads": text.num_attention_heads,
            "num_hidden_layers": text.num_hidden_layers,
            "num_key_value_heads": text.num_key_value_heads,
            "rms_norm_eps": text.rms_norm_eps,
            "rope_parameters": {
                "mrope_interleaved": true,
                "mrope_section": section,
                "rope_theta": text.rope_theta,
                "rope_type": "default"
            },
            "vocab_size": text.vocab_size
        },
        "vision_config": {
            "model_type": "qwen3_vl",
            "depth": v.depth,
            "hidden_act": v.hidden_act,
            "hidden_size": v.hidden_size,
            "intermediate_size": v.intermediate_size,
            "num_heads": v.num_heads,
            "out_hidden_size": v.out_hidden_size,
            "patch_size": v.patch_size,
            "spatial_merge_size": v.spatial_merge_size,
            "temporal_patch_size": v.temporal_patch_size,
            "deepstack_visual_indexes": v.deepstack_visual_indexes,
            "num_position_embeddings": v.num_position_embeddings
        }
    });
    write_component(out, &encoder.store, "model.safetensors", &config)?;
    let file = out.join("model.safetensors");
    let mut tensors: Vec<(String, Tensor)> = Tensor::read_safetensors(&file)?
        .into_iter()
        .map(|(name, t)| (format!("model.language_model.{name}"), t))
        .collect();
    tensors
        .extend(vision.store.variables().into_iter().map(|(name, t)| (format!("model.{name}"), t)));
    Ok(Tensor::write_safetensors(&tensors, &file)?)
}
