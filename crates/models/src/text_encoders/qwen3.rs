//! Qwen3's language model (`Qwen3Model` / `Qwen3ForCausalLM`), Z-Image's text encoder: the
//! shared Qwen decoder with per-head q/k norms, no q/k/v biases, an explicit head width and
//! plain 1-D rotary positions. Z-Image reads `hidden_states[-2]`: the output of the
//! second-to-last layer, before any final norm.

use std::path::Path;

use serde::Deserialize;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::qwen_decoder::{plain_rope_theta, DecoderShape, QwenDecoder, RopeFields};
use crate::nn::Scope;
use crate::{read_config, ModelError};

/// `lm_head` of a `Qwen3ForCausalLM` checkpoint is not loaded.
const IGNORED_PREFIXES: &[&str] = &["lm_head."];
/// `Qwen3ForCausalLM` keys carry `model.`; `Qwen3Model`'s do not.
const RENAMED_PREFIXES: &[(&str, &str)] = &[("model.", "")];

/// `config.json` of a Qwen3 text model, with transformers' `Qwen3Config` defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
struct Qwen3Fields {
    vocab_size: i64,
    hidden_size: i64,
    intermediate_size: i64,
    num_hidden_layers: usize,
    num_attention_heads: i64,
    num_key_value_heads: Option<i64>,
    head_dim: i64,
    hidden_act: String,
    rms_norm_eps: f64,
    attention_bias: bool,
    use_sliding_window: bool,
    rope_theta: Option<f64>,
    rope_parameters: Option<RopeFields>,
    rope_scaling: Option<RopeFields>,
}

impl Default for Qwen3Fields {
    fn default() -> Self {
        Self {
            vocab_size: 151936,
            hidden_size: 4096,
            intermediate_size: 22016,
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: Some(32),
            head_dim: 128,
            hidden_act: "silu".into(),
            rms_norm_eps: 1e-6,
            attention_bias: false,
            use_sliding_window: false,
            rope_theta: None,
            rope_parameters: None,
            rope_scaling: None,
        }
    }
}

/// Reads a Qwen3 `config.json` into the decoder's shape, rejecting what it does not run.
pub fn qwen3_shape(path: &Path) -> Result<DecoderShape, ModelError> {
    shape_of(read_config(path)?, path)
}

/// The language model's shape from a `Qwen3VLForConditionalGeneration` `config.json`
/// (`text_config`). Its multimodal rotary sections rotate text tokens, whose three position axes
/// are equal, exactly as plain 1-D rotary positions do.
pub fn qwen3_vl_text_shape(path: &Path) -> Result<DecoderShape, ModelError> {
    let config: serde_json::Value = read_config(path)?;
    let fields =
        serde_json::from_value(config["text_config"].clone()).map_err(|e| ModelError::Format {
            path: path.display().to_string(),
            message: format!("text_config: {e}"),
        })?;
    shape_of(fields, path)
}

fn shape_of(f: Qwen3Fields, path: &Path) -> Result<DecoderShape, ModelError> {
    let bad = |message: String| ModelError::Format { path: path.display().to_string(), message };
    if f.hidden_act != "silu" || f.attention_bias || f.use_sliding_window {
        return Err(bad(format!(
            "hidden_act `{}`, attention_bias {}, use_sliding_window {}: expected silu, false, false",
            f.hidden_act, f.attention_bias, f.use_sliding_window
        )));
    }
    let rope_theta =
        plain_rope_theta(f.rope_parameters, f.rope_scaling, f.rope_theta).map_err(bad)?;
    let heads = f.num_attention_heads;
    let kv_heads = f.num_key_value_heads.unwrap_or(heads);
    if heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 || f.head_dim % 2 != 0 {
        return Err(bad(format!(
            "num_attention_heads {heads} / num_key_value_heads {kv_heads} / head_dim {}: expected \
             heads divisible by the kv heads and an even head_dim",
            f.head_dim
        )));
    }
    Ok(DecoderShape {
        vocab_size: f.vocab_size,
        hidden_size: f.hidden_size,
        intermediate_size: f.intermediate_size,
        num_hidden_layers: f.num_hidden_layers,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim: f.head_dim,
        rms_norm_eps: f.rms_norm_eps,
        rope_theta,
        qkv_bias: false,
        qk_norm: true,
    })
}

/// The Qwen3 decoder stack (`embed_tokens`, `layers.N.…`, `norm`).
pub struct Qwen3TextEncoder {
    decoder: QwenDecoder,
    pub store: VarStore,
}

impl Qwen3TextEncoder {
    /// Variables for `shape` (zeros until loaded).
    pub fn new(shape: &DecoderShape, device: Device, kind: Kind) -> Self {
        let store = super::store(device, kind);
        let decoder = QwenDecoder::new(&Scope::root(store.root(), None), shape);
        Self { decoder, store }
    }

    /// Loads a transformers directory (`config.json` + safetensors, with or without the
    /// `model.` prefix), frozen; `lm_head` is skipped.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let mut model = Self::new(&qwen3_shape(&dir.join("config.json"))?, device, kind);
        super::load_frozen(&mut model.store, dir, kind, IGNORED_PREFIXES, RENAMED_PREFIXES)?;
        Ok(model)
    }

    /// The language model of a `Qwen3VLForConditionalGeneration` directory, frozen; the vision
    /// tower and `lm_head` are skipped.
    pub fn load_vl(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let mut model = Self::new(&qwen3_vl_text_shape(&dir.join("config.json"))?, device, kind);
        let ignored = &["lm_head.", "model.visual.", "visual."];
        let renamed = &[("model.language_model.", "")];
        super::load_frozen(&mut model.store, dir, kind, ignored, renamed)?;
        Ok(model)
    }

    /// The last layer's output (B, L, hidden_size) before the final norm, as
    /// [`Self::penultimate`] takes its inputs.
    pub fn last_layer(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
    ) -> Result<Tensor, ModelError> {
        let depth = self.decoder.shape.num_hidden_layers;
        let mut states = self.states(input_ids, attention_mask, &[depth], false)?;
        Ok(states.pop().expect("one state"))
    }

    /// Width of the hidden states.
    pub fn hidden_size(&self) -> i64 {
        self.decoder.shape.hidden_size
    }

    /// Decoder layers.
    pub fn num_layers(&self) -> usize {
        self.decoder.shape.num_hidden_layers
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> i64 {
        self.decoder.shape.head_dim
    }

    /// The decoder stack (Qwen3-VL runs it with pictures).
    pub(crate) fn decoder(&self) -> &QwenDecoder {
        &self.decoder
    }

    /// transformers' `hidden_states[-2]` with `output_hidden_states=True` (B, L, hidden_size) for
    /// `input_ids` (B, L) and `attention_mask` (B, L) of ones and zeros (padding), at positions
    /// 0‥L: the embeddings after all layers but the last, without the final norm.
    pub fn penultimate(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
    ) -> Result<Tensor, ModelError> {
        let depth = self.decoder.shape.num_hidden_layers.saturating_sub(1);
        let mut states = self.hidden_states(input_ids, attention_mask, &[depth])?;
        Ok(states.pop().expect("one state"))
    }

    /// transformers' `hidden_states[k]` for each `k` of `layers` (ascending, at most the layer
    /// count; the last layer's is after the final norm), as [`Self::penultimate`] takes its inputs.
    pub fn hidden_states(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        layers: &[usize],
    ) -> Result<Vec<Tensor>, ModelError> {
        self.states(input_ids, attention_mask, layers, true)
    }

    /// [`Self::hidden_states`], the last layer's after the final norm when `final_norm`.
    fn states(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        layers: &[usize],
        final_norm: bool,
    ) -> Result<Vec<Tensor>, ModelError> {
        self.decoder.text_states("Qwen3", input_ids, attention_mask, layers, final_norm)
    }
}
