//! The language model of `Mistral3ForConditionalGeneration` (Mistral Small 3.x), FLUX.2 [dev]'s
//! text encoder: the shared decoder without q/k/v biases or head norms, plain 1-D rotary
//! positions and grouped-query attention. The Pixtral vision tower and its projector are not
//! loaded (the pipeline encodes text only).

use std::path::Path;

use serde::Deserialize;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::qwen_decoder::{plain_rope_theta, DecoderShape, QwenDecoder, RopeFields};
use crate::nn::Scope;
use crate::{read_config, ModelError};

/// The vision tower, its projector and `lm_head`, in both checkpoint layouts.
const IGNORED_PREFIXES: &[&str] = &[
    "lm_head.",
    "model.vision_tower.",
    "model.multi_modal_projector.",
    "vision_tower.",
    "multi_modal_projector.",
    "language_model.lm_head.",
];
/// transformers ≥ 4.52 saves `model.language_model.…`; older checkpoints `language_model.model.…`.
const RENAMED_PREFIXES: &[(&str, &str)] =
    &[("model.language_model.", ""), ("language_model.model.", "")];

/// `text_config` of a Mistral3 `config.json`, with transformers' `MistralConfig` defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
struct MistralFields {
    vocab_size: i64,
    hidden_size: i64,
    intermediate_size: i64,
    num_hidden_layers: usize,
    num_attention_heads: i64,
    num_key_value_heads: Option<i64>,
    head_dim: Option<i64>,
    hidden_act: String,
    rms_norm_eps: f64,
    sliding_window: Option<i64>,
    rope_theta: Option<f64>,
    rope_parameters: Option<RopeFields>,
    rope_scaling: Option<RopeFields>,
}

impl Default for MistralFields {
    fn default() -> Self {
        Self {
            vocab_size: 32000,
            hidden_size: 4096,
            intermediate_size: 14336,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: Some(8),
            head_dim: None,
            hidden_act: "silu".into(),
            rms_norm_eps: 1e-6,
            sliding_window: Some(4096),
            rope_theta: None,
            rope_parameters: None,
            rope_scaling: None,
        }
    }
}

/// The language model's shape and attention window from a Mistral3 `config.json`
/// (`text_config`), rejecting what the decoder does not run.
pub fn mistral3_text_shape(path: &Path) -> Result<(DecoderShape, Option<i64>), ModelError> {
    let config: serde_json::Value = read_config(path)?;
    let bad = |message: String| ModelError::Format { path: path.display().to_string(), message };
    let f: MistralFields = serde_json::from_value(config["text_config"].clone())
        .map_err(|e| bad(format!("text_config: {e}")))?;
    if f.hidden_act != "silu" {
        return Err(bad(format!("text_config.hidden_act `{}`: expected silu", f.hidden_act)));
    }
    let rope_theta = plain_rope_theta(f.rope_parameters, f.rope_scaling, f.rope_theta)
        .map_err(|e| bad(format!("text_config {e}")))?;
    let heads = f.num_attention_heads;
    let kv_heads = f.num_key_value_heads.unwrap_or(heads);
    let head_dim = f.head_dim.unwrap_or(if heads > 0 { f.hidden_size / heads } else { 0 });
    if heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 || head_dim <= 0 || head_dim % 2 != 0 {
        return Err(bad(format!(
            "text_config num_attention_heads {heads} / num_key_value_heads {kv_heads} / head_dim \
             {head_dim}: expected heads divisible by the kv heads and an even head_dim"
        )));
    }
    let shape = DecoderShape {
        vocab_size: f.vocab_size,
        hidden_size: f.hidden_size,
        intermediate_size: f.intermediate_size,
        num_hidden_layers: f.num_hidden_layers,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim,
        rms_norm_eps: f.rms_norm_eps,
        rope_theta,
        qkv_bias: false,
        qk_norm: false,
    };
    Ok((shape, f.sliding_window))
}

/// The Mistral decoder stack (`embed_tokens`, `layers.N.…`, `norm`) of a Mistral3 checkpoint.
pub struct Mistral3TextEncoder {
    decoder: QwenDecoder,
    /// Attention window (`sliding_window`); longer inputs are refused.
    window: Option<i64>,
    pub store: VarStore,
}

impl Mistral3TextEncoder {
    /// Variables for `shape` (zeros until loaded).
    pub fn new(shape: &DecoderShape, window: Option<i64>, device: Device, kind: Kind) -> Self {
        let store = super::store(device, kind);
        let decoder = QwenDecoder::new(&Scope::root(store.root(), None), shape);
        Self { decoder, window, store }
    }

    /// Loads the language model of a `Mistral3ForConditionalGeneration` directory, frozen.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let (shape, window) = mistral3_text_shape(&dir.join("config.json"))?;
        let mut model = Self::new(&shape, window, device, kind);
        super::load_frozen(&mut model.store, dir, kind, IGNORED_PREFIXES, RENAMED_PREFIXES)?;
        Ok(model)
    }

    /// Width of the hidden states.
    pub fn hidden_size(&self) -> i64 {
        self.decoder.shape.hidden_size
    }

    /// Decoder layers.
    pub fn num_layers(&self) -> usize {
        self.decoder.shape.num_hidden_layers
    }

    /// transformers' `hidden_states[k]` for each `k` of `layers` (ascending; the last layer's is
    /// after the final norm) of `input_ids` (B, L) under `attention_mask` (B, L), positions 0‥L
    /// whichever side the padding is on, as the model's forward without `position_ids` has them.
    pub fn hidden_states(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        layers: &[usize],
    ) -> Result<Vec<Tensor>, ModelError> {
        let length = input_ids.size().last().copied().unwrap_or(0);
        if let Some(window) = self.window.filter(|&w| length > w) {
            return Err(ModelError::Input(format!(
                "{length} Mistral tokens exceed the text encoder's sliding_window {window}"
            )));
        }
        self.decoder.text_states("Mistral3", input_ids, attention_mask, layers, true)
    }
}
