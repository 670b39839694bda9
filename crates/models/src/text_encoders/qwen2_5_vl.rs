//! The language model of `Qwen2_5_VLForConditionalGeneration` (Qwen-Image's text encoder):
//! pre-norm decoder layers with grouped-query attention (q/k/v biases, rotary positions) and a
//! SwiGLU MLP. The vision tower and `lm_head` of the checkpoint are not loaded; image embeddings
//! from [`super::qwen2_5_vl_vision`] come in through [`Qwen25VlTextEncoder::forward_multimodal`].
//!
//! Rotary positions are multimodal (3-D): each frequency group of `mrope_section` rotates by one
//! of three position rows (temporal, height, width; see [`super::qwen2_5_vl_positions`]). Text
//! tokens have equal rows, which makes it ordinary RoPE with `rope_theta`.

use std::path::Path;

use serde::Deserialize;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::qwen2_5_vl_positions::{multimodal_positions, text_positions};
use super::qwen_decoder::{DecoderShape, QwenDecoder};
use crate::nn::Scope;
use crate::{read_config, ModelError};

/// Checkpoint parts that are not the language model (a preference model's head too).
const IGNORED_PREFIXES: &[&str] = &["visual.", "model.visual.", "lm_head.", "rm_head."];
/// transformers 5 module names for the language model.
const RENAMED_PREFIXES: &[(&str, &str)] = &[("model.language_model.", "model.")];

/// The text fields of a Qwen2.5-VL `config.json`, from its `text_config` (transformers 5) or from
/// the top level (the flat layout of `Qwen/Qwen-Image`'s `text_encoder/config.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen25VlTextConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    /// Rotary frequencies per position row (temporal, height, width), summing to head_dim / 2;
    /// `None` when the config has none (transformers then uses [16, 24, 24]).
    pub mrope_section: Option<Vec<i64>>,
    /// The `<|image_pad|>` token whose embeddings images replace.
    pub image_token_id: i64,
}

/// transformers' `mrope_section` when the config gives none.
const DEFAULT_MROPE_SECTION: [i64; 3] = [16, 24, 24];

/// Rope settings: `rope_parameters` (transformers 5) or `rope_scaling` (4.x).
#[derive(Debug, Clone, Default, Deserialize)]
struct RopeFields {
    rope_theta: Option<f64>,
    rope_type: Option<String>,
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    mrope_section: Option<Vec<i64>>,
}

/// Either layout's text fields, with transformers' `Qwen2_5_VLTextConfig` defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
struct TextFields {
    vocab_size: i64,
    hidden_size: i64,
    intermediate_size: i64,
    num_hidden_layers: usize,
    num_attention_heads: i64,
    num_key_value_heads: Option<i64>,
    rms_norm_eps: f64,
    hidden_act: String,
    use_sliding_window: bool,
    rope_theta: Option<f64>,
    rope_parameters: Option<RopeFields>,
    rope_scaling: Option<RopeFields>,
}

impl Default for TextFields {
    fn default() -> Self {
        Self {
            vocab_size: 152064,
            hidden_size: 8192,
            intermediate_size: 29568,
            num_hidden_layers: 80,
            num_attention_heads: 64,
            num_key_value_heads: Some(8),
            rms_norm_eps: 1e-5,
            hidden_act: "silu".into(),
            use_sliding_window: false,
            rope_theta: None,
            rope_parameters: None,
            rope_scaling: None,
        }
    }
}

#[derive(Deserialize)]
struct ConfigFile {
    text_config: Option<TextFields>,
    image_token_id: Option<i64>,
    #[serde(flatten)]
    flat: TextFields,
}

impl Qwen25VlTextConfig {
    /// Reads `config.json` in either layout; a nested `text_config` wins, as in transformers 5.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let file: ConfigFile = read_config(path)?;
        let t = file.text_config.unwrap_or(file.flat);
        let bad =
            |message: String| ModelError::Format { path: path.display().to_string(), message };
        if t.hidden_act != "silu" {
            return Err(bad(format!(
                "hidden_act `{}` is not supported; expected silu",
                t.hidden_act
            )));
        }
        if t.use_sliding_window {
            return Err(bad("use_sliding_window=true is not supported; expected false".into()));
        }
        let rope = t.rope_parameters.or(t.rope_scaling).unwrap_or_default();
        let rope_type = rope.rope_type.or(rope.legacy_type).unwrap_or_else(|| "default".into());
        if rope_type != "default" && rope_type != "mrope" {
            return Err(bad(format!(
                "rope type `{rope_type}` is not supported; expected default or mrope"
            )));
        }
        let heads = t.num_attention_heads;
        let kv_heads = t.num_key_value_heads.unwrap_or(heads);
        if heads <= 0 || t.hidden_size % heads != 0 || kv_heads <= 0 || heads % kv_heads != 0 {
            return Err(bad(format!(
                "hidden_size {} / num_attention_heads {heads} / num_key_value_heads {kv_heads}: \
                 expected hidden_size divisible by the heads and the heads by the kv heads",
                t.hidden_size
            )));
        }
        let half = t.hidden_size / heads / 2;
        if let Some(section) = rope.mrope_section.as_ref() {
            if section.len() != 3
                || section.iter().any(|&n| n < 0)
                || section.iter().sum::<i64>() != half
            {
                return Err(bad(format!(
                    "mrope_section {section:?}: expected three sizes summing to head_dim / 2 = {half}"
                )));
            }
        }
        Ok(Self {
            vocab_size: t.vocab_size,
            hidden_size: t.hidden_size,
            intermediate_size: t.intermediate_size,
            num_hidden_layers: t.num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            rms_norm_eps: t.rms_norm_eps,
            rope_theta: rope.rope_theta.or(t.rope_theta).unwrap_or(1e6),
            mrope_section: rope.mrope_section,
            image_token_id: file.image_token_id.unwrap_or(151655),
        })
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> i64 {
        self.hidden_size / self.num_attention_heads
    }
}

/// The decoder stack with module names `model.embed_tokens`, `model.layers.N.…`, `model.norm`.
pub struct Qwen25VlTextEncoder {
    pub config: Qwen25VlTextConfig,
    decoder: QwenDecoder,
    pub store: VarStore,
}

impl Qwen25VlTextEncoder {
    /// Variables for `config` (zeros until loaded).
    pub fn new(config: &Qwen25VlTextConfig, device: Device, kind: Kind) -> Self {
        let store = super::store(device, kind);
        let root = Scope::root(store.root(), None);
        let shape = DecoderShape {
            vocab_size: config.vocab_size,
            hidden_size: config.hidden_size,
            intermediate_size: config.intermediate_size,
            num_hidden_layers: config.num_hidden_layers,
            num_attention_heads: config.num_attention_heads,
            num_key_value_heads: config.num_key_value_heads,
            head_dim: config.head_dim(),
            rms_norm_eps: config.rms_norm_eps,
            rope_theta: config.rope_theta,
            qkv_bias: true,
            qk_norm: false,
        };
        let decoder = QwenDecoder::new(&(&root / "model"), &shape);
        Self { config: config.clone(), decoder, store }
    }

    /// Loads a transformers directory (`config.json` + safetensors, either key layout), frozen;
    /// the vision tower and `lm_head` are skipped.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let config = Qwen25VlTextConfig::from_file(&dir.join("config.json"))?;
        let mut model = Self::new(&config, device, kind);
        super::load_frozen(&mut model.store, dir, kind, IGNORED_PREFIXES, RENAMED_PREFIXES)?;
        Ok(model)
    }

    /// The decoder stack (judges run it with pictures and a cache).
    pub(crate) fn decoder(&self) -> &QwenDecoder {
        &self.decoder
    }

    /// The rotary groups: `mrope_section`, or transformers' default, checked against head_dim.
    pub(crate) fn mrope_section(&self) -> Result<Vec<i64>, ModelError> {
        let section = self.config.mrope_section.clone().unwrap_or(DEFAULT_MROPE_SECTION.to_vec());
        let half = self.config.head_dim() / 2;
        if section.iter().sum::<i64>() != half {
            return Err(ModelError::Input(format!(
                "Qwen2.5-VL mrope_section {section:?} must sum to head_dim / 2 = {half}; give it \
                 in the config's rope_scaling"
            )));
        }
        Ok(section)
    }

    /// (B, L) of `input_ids`, checked against `attention_mask`.
    fn check_inputs(input_ids: &Tensor, attention_mask: &Tensor) -> Result<(i64, i64), ModelError> {
        let (b, l) = input_ids.size2().map_err(|_| {
            ModelError::Input(format!(
                "Qwen2.5-VL input_ids must be (B, L), got {:?}",
                input_ids.size()
            ))
        })?;
        if attention_mask.size() != [b, l] {
            return Err(ModelError::Input(format!(
                "Qwen2.5-VL attention_mask must have the shape of input_ids {:?}, got {:?}",
                [b, l],
                attention_mask.size()
            )));
        }
        Ok((b, l))
    }

    /// `hidden_states[-1]` of transformers with `output_hidden_states=True` (after the final
    /// norm), (B, L, hidden_size), for `input_ids` (B, L) and `attention_mask` (B, L) of ones
    /// and zeros (padding), under a causal mask; text only, at positions 0‥L.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
    ) -> Result<Tensor, ModelError> {
        let (b, l) = Self::check_inputs(input_ids, attention_mask)?;
        let positions = text_positions(b, l, input_ids.device());
        // equal rows make any grouping the same; one group needs no mrope_section
        let section = [self.config.head_dim() / 2];
        self.decode(self.decoder.embed(input_ids), attention_mask, &positions, &section)
    }

    /// As [`Self::forward`], with pictures: `image_embeds` (N, hidden_size), the vision tower's
    /// merged embeddings of the pictures with patch grids `grids` (in order; N = Σ t·h·w /
    /// `spatial_merge_size`²), replace the embeddings of the `image_token_id` tokens in row-major
    /// order, and positions are [`multimodal_positions`] (transformers with `mm_token_type_ids`).
    pub fn forward_multimodal(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        image_embeds: &Tensor,
        grids: &[(i64, i64, i64)],
        spatial_merge_size: i64,
    ) -> Result<Tensor, ModelError> {
        Self::check_inputs(input_ids, attention_mask)?;
        let section = self.mrope_section()?;
        let image_token = self.config.image_token_id;
        let positions = multimodal_positions(
            input_ids,
            attention_mask,
            image_token,
            grids,
            spatial_merge_size,
        )?;
        let slots = input_ids.eq(image_token);
        let count = slots.sum(Kind::Int64).int64_value(&[]);
        if image_embeds.size() != [count, self.config.hidden_size] {
            return Err(ModelError::Input(format!(
                "Qwen2.5-VL image_embeds must be ({count}, {}) for the {count} image tokens, got \
                 {:?}",
                self.config.hidden_size,
                image_embeds.size()
            )));
        }
        let x = self.decoder.embed(input_ids);
        let x = x.masked_scatter(&slots.unsqueeze(-1), &image_embeds.to_kind(x.kind()));
        self.decode(x, attention_mask, &positions, &section)
    }

    /// The decoder stack and final norm on embeddings `x` (B, L, D) at `positions` (3, B, L).
    fn decode(
        &self,
        x: Tensor,
        attention_mask: &Tensor,
        positions: &Tensor,
        section: &[i64],
    ) -> Result<Tensor, ModelError> {
        let depth = self.config.num_hidden_layers;
        let x = self.decoder.run(x, attention_mask, positions, section, depth)?;
        Ok(self.decoder.final_norm(&x))
    }
}
