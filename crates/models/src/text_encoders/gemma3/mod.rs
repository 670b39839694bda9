//! The language model of `Gemma3ForConditionalGeneration` (Gemma-3), LTX-2's text encoder: token
//! embeddings scaled by √hidden, pre- and post-norms around attention and the GELU(tanh) MLP
//! (RMS norms scaled by 1 + w), per-head q/k norms, grouped-query attention, and local
//! sliding-window layers beside global ones, each kind with its own rotary θ (the global ones
//! possibly linearly scaled). LTX-2 reads every hidden state ([`Gemma3TextEncoder::hidden_states`]).

pub mod prompts;
pub mod tiny;

use std::path::Path;

use serde::Deserialize;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::nn::{attention, gelu_tanh, Embedding, Linear, Scope};
use crate::{read_config, ModelError};

/// Not loaded: `lm_head` (tied to the embeddings), the SigLIP vision tower and its projector, in
/// the transformers ≥ 4.52 layout (`model.…`) and the older one.
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

/// The attention of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// `sliding_attention`: the last `sliding_window` tokens up to the query.
    Sliding,
    /// `full_attention`: every token up to the query.
    Full,
}

/// Rotary positions of one layer kind: θ and the linear scaling factor (1 for `default`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub factor: f64,
}

/// The language model's configuration (`text_config` of a `Gemma3ForConditionalGeneration`
/// `config.json`, or a `gemma3_text` config), resolved as transformers resolves it.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma3TextConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub head_dim: i64,
    pub rms_norm_eps: f64,
    /// Scores are scaled by `query_pre_attn_scalar^-½`.
    pub query_pre_attn_scalar: f64,
    pub sliding_window: i64,
    /// One entry per layer (`layer_types`, or `sliding_window_pattern`: every p-th is global).
    pub layer_types: Vec<LayerKind>,
    /// θ and scaling of the global layers (`rope_theta`, `rope_scaling`).
    pub full_rope: Rope,
    /// θ of the local layers (`rope_local_base_freq`).
    pub sliding_rope: Rope,
}

/// `rope_scaling` or one entry of `rope_parameters`.
#[derive(Debug, Clone, Default, Deserialize)]
struct RopeFields {
    rope_type: Option<String>,
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    factor: Option<f64>,
    rope_theta: Option<f64>,
}

/// transformers 5's `rope_parameters`, by layer type.
#[derive(Debug, Clone, Default, Deserialize)]
struct RopeByLayer {
    full_attention: Option<RopeFields>,
    sliding_attention: Option<RopeFields>,
}

/// The text fields of a Gemma-3 `config.json`, with `Gemma3TextConfig`'s defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
struct Gemma3Fields {
    vocab_size: i64,
    hidden_size: i64,
    intermediate_size: i64,
    num_hidden_layers: usize,
    num_attention_heads: i64,
    num_key_value_heads: i64,
    head_dim: i64,
    hidden_activation: String,
    rms_norm_eps: f64,
    attention_bias: bool,
    query_pre_attn_scalar: f64,
    sliding_window: Option<i64>,
    sliding_window_pattern: Option<usize>,
    layer_types: Option<Vec<String>>,
    rope_theta: Option<f64>,
    rope_local_base_freq: Option<f64>,
    rope_scaling: Option<RopeFields>,
    rope_parameters: Option<RopeByLayer>,
    attn_logit_softcapping: Option<f64>,
    use_bidirectional_attention: Option<bool>,
}

impl Default for Gemma3Fields {
    fn default() -> Self {
        Self {
            vocab_size: 262_208,
            hidden_size: 2304,
            intermediate_size: 9216,
            num_hidden_layers: 26,
            num_attention_heads: 8,
            num_key_value_heads: 4,
            head_dim: 256,
            hidden_activation: "gelu_pytorch_tanh".into(),
            rms_norm_eps: 1e-6,
            attention_bias: false,
            query_pre_attn_scalar: 256.0,
            sliding_window: Some(4096),
            sliding_window_pattern: None,
            layer_types: None,
            rope_theta: None,
            rope_local_base_freq: None,
            rope_scaling: None,
            rope_parameters: None,
            attn_logit_softcapping: None,
            use_bidirectional_attention: None,
        }
    }
}

/// θ and factor of `fields` (θ defaulting to `theta`), refusing rotary kinds other than
/// `default` and `linear`; `key` names the fields in errors.
fn rope_of(fields: RopeFields, theta: f64, key: &str) -> Result<Rope, String> {
    let kind = fields.rope_type.or(fields.legacy_type).unwrap_or_else(|| "default".into());
    let factor = match kind.as_str() {
        "default" => 1.0,
        "linear" => fields.factor.ok_or(format!("{key}: linear rope without `factor`"))?,
        other => {
            return Err(format!("{key}.rope_type `{other}` is not supported (default or linear)"))
        }
    };
    Ok(Rope { theta: fields.rope_theta.unwrap_or(theta), factor })
}

impl Gemma3TextConfig {
    /// Reads the language model's configuration from a `Gemma3ForConditionalGeneration`
    /// `config.json` (its `text_config`) or a flat `gemma3_text` one, refusing what the encoder
    /// does not run by key name.
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        let config: serde_json::Value = read_config(path)?;
        let bad =
            |message: String| ModelError::Format { path: path.display().to_string(), message };
        let (text, prefix) = match config.get("text_config") {
            Some(text) => (text.clone(), "text_config."),
            None => (config, ""),
        };
        let f: Gemma3Fields =
            serde_json::from_value(text).map_err(|e| bad(format!("{prefix}: {e}")))?;
        Self::from_fields(f, prefix).map_err(bad)
    }

    fn from_fields(f: Gemma3Fields, prefix: &str) -> Result<Self, String> {
        let refuse = |key: &str, value: String, expected: &str| {
            Err(format!("{prefix}{key} {value} is not supported (expected {expected})"))
        };
        if f.hidden_activation != "gelu_pytorch_tanh" {
            return refuse("hidden_activation", f.hidden_activation, "gelu_pytorch_tanh");
        }
        if f.attention_bias {
            return refuse("attention_bias", "true".into(), "false");
        }
        if let Some(cap) = f.attn_logit_softcapping {
            return refuse("attn_logit_softcapping", cap.to_string(), "null");
        }
        if f.use_bidirectional_attention == Some(true) {
            return refuse("use_bidirectional_attention", "true".into(), "false");
        }
        let (heads, kv_heads, head_dim) =
            (f.num_attention_heads, f.num_key_value_heads, f.head_dim);
        if heads <= 0
            || kv_heads <= 0
            || heads % kv_heads != 0
            || head_dim <= 0
            || head_dim % 2 != 0
        {
            return Err(format!(
                "{prefix}num_attention_heads {heads} / num_key_value_heads {kv_heads} / head_dim \
                 {head_dim}: expected heads divisible by the kv heads and an even head_dim"
            ));
        }
        let layer_types =
            match f.layer_types {
                Some(types) => types
                    .iter()
                    .map(|t| match t.as_str() {
                        "sliding_attention" => Ok(LayerKind::Sliding),
                        "full_attention" => Ok(LayerKind::Full),
                        other => Err(format!(
                        "{prefix}layer_types entry `{other}` is not supported (sliding_attention \
                         or full_attention)"
                    )),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                None => {
                    let pattern = f.sliding_window_pattern.unwrap_or(6);
                    if pattern == 0 {
                        return refuse("sliding_window_pattern", "0".into(), "at least 1");
                    }
                    (0..f.num_hidden_layers)
                        .map(|i| {
                            if (i + 1) % pattern == 0 {
                                LayerKind::Full
                            } else {
                                LayerKind::Sliding
                            }
                        })
                        .collect()
                }
            };
        if layer_types.len() != f.num_hidden_layers {
            return Err(format!(
                "{prefix}layer_types has {} entries for num_hidden_layers {}",
                layer_types.len(),
                f.num_hidden_layers
            ));
        }
        let sliding_window = match f.sliding_window {
            Some(w) if w > 0 => w,
            _ if !layer_types.contains(&LayerKind::Sliding) => i64::MAX,
            other => return refuse("sliding_window", format!("{other:?}"), "a positive window"),
        };
        // transformers: `rope_parameters` by layer type, `rope_scaling` merged into the global
        // one, then the flat θs (1e6 global, 1e4 local by default).
        let by_layer = f.rope_parameters.unwrap_or_default();
        let mut full = by_layer.full_attention.unwrap_or_default();
        if let Some(scaling) = f.rope_scaling {
            full = RopeFields {
                rope_type: scaling.rope_type.or(scaling.legacy_type).or(full.rope_type),
                legacy_type: None,
                factor: scaling.factor.or(full.factor),
                rope_theta: scaling.rope_theta.or(full.rope_theta),
            };
        }
        let full_key = format!("{prefix}rope_parameters.full_attention");
        let full_rope = rope_of(full, f.rope_theta.unwrap_or(1e6), &full_key)?;
        let sliding = by_layer.sliding_attention.unwrap_or_default();
        let sliding_key = format!("{prefix}rope_parameters.sliding_attention");
        let sliding_rope = rope_of(sliding, f.rope_local_base_freq.unwrap_or(1e4), &sliding_key)?;
        Ok(Self {
            vocab_size: f.vocab_size,
            hidden_size: f.hidden_size,
            intermediate_size: f.intermediate_size,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rms_norm_eps: f.rms_norm_eps,
            query_pre_attn_scalar: f.query_pre_attn_scalar,
            sliding_window,
            layer_types,
            full_rope,
            sliding_rope,
        })
    }

    /// Decoder layers.
    pub fn num_hidden_layers(&self) -> usize {
        self.layer_types.len()
    }
}

/// Gemma's RMS norm: statistics and the (1 + w) scale in f32, the result in the input's kind.
struct GemmaNorm {
    weight: Tensor,
    eps: f64,
}

impl GemmaNorm {
    fn new(scope: &Scope<'_>, dim: i64, eps: f64) -> Self {
        Self { weight: scope.var("weight", &[dim]), eps }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let xf = x.to_kind(Kind::Float);
        let variance = xf.square().mean_dim(-1, true, Kind::Float);
        let scale = self.weight.to_kind(Kind::Float) + 1.0;
        (xf * (variance + self.eps).rsqrt() * scale).to_kind(x.kind())
    }
}

struct Layer {
    kind: LayerKind,
    input_layernorm: GemmaNorm,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: GemmaNorm,
    k_norm: GemmaNorm,
    post_attention_layernorm: GemmaNorm,
    pre_feedforward_layernorm: GemmaNorm,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    post_feedforward_layernorm: GemmaNorm,
}

/// The Gemma-3 decoder stack (`embed_tokens`, `layers.N.…`, `norm`).
pub struct Gemma3TextEncoder {
    pub config: Gemma3TextConfig,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    norm: GemmaNorm,
    pub store: VarStore,
}

impl Gemma3TextEncoder {
    /// Variables for `config` (uninitialised until loaded).
    pub fn new(config: &Gemma3TextConfig, device: Device, kind: Kind) -> Self {
        let store = super::store(device, kind);
        let root = Scope::root(store.root(), None);
        let c = config;
        let (d, eps) = (c.hidden_size, c.rms_norm_eps);
        let (q, kv) = (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim);
        let norm = |s: &Scope<'_>, name: &str, dim: i64| GemmaNorm::new(&(s / name), dim, eps);
        let layers = c
            .layer_types
            .iter()
            .enumerate()
            .map(|(i, &kind)| {
                let layer = &(&root / "layers") / i;
                let (attn, mlp) = (&layer / "self_attn", &layer / "mlp");
                Layer {
                    kind,
                    input_layernorm: norm(&layer, "input_layernorm", d),
                    q_proj: (&attn / "q_proj").linear(d, q, false),
                    k_proj: (&attn / "k_proj").linear(d, kv, false),
                    v_proj: (&attn / "v_proj").linear(d, kv, false),
                    o_proj: (&attn / "o_proj").linear(q, d, false),
                    q_norm: norm(&attn, "q_norm", c.head_dim),
                    k_norm: norm(&attn, "k_norm", c.head_dim),
                    post_attention_layernorm: norm(&layer, "post_attention_layernorm", d),
                    pre_feedforward_layernorm: norm(&layer, "pre_feedforward_layernorm", d),
                    gate_proj: (&mlp / "gate_proj").linear(d, c.intermediate_size, false),
                    up_proj: (&mlp / "up_proj").linear(d, c.intermediate_size, false),
                    down_proj: (&mlp / "down_proj").linear(c.intermediate_size, d, false),
                    post_feedforward_layernorm: norm(&layer, "post_feedforward_layernorm", d),
                }
            })
            .collect();
        Self {
            embed_tokens: Embedding::new(&(&root / "embed_tokens"), c.vocab_size, d),
            layers,
            norm: norm(&root, "norm", d),
            config: config.clone(),
            store,
        }
    }

    /// Loads the language model of a `Gemma3ForConditionalGeneration` directory (`config.json` +
    /// safetensors), frozen; a missing tensor is an error naming it.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let config = Gemma3TextConfig::load(&dir.join("config.json"))?;
        let mut model = Self::new(&config, device, kind);
        super::load_frozen(&mut model.store, dir, kind, IGNORED_PREFIXES, RENAMED_PREFIXES)?;
        Ok(model)
    }

    /// Width of the hidden states.
    pub fn hidden_size(&self) -> i64 {
        self.config.hidden_size
    }

    /// Where the weights lie.
    pub fn embed_device(&self) -> Device {
        self.embed_tokens.weight.device()
    }

    /// Decoder layers (the hidden states are one more).
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// transformers' `hidden_states` with `output_hidden_states=True`: the scaled embeddings and
    /// each layer's output (B, L, hidden_size), the last one after the final norm, for
    /// `input_ids` (B, L) and `attention_mask` (B, L) of ones and zeros (padding on either side)
    /// at positions 0‥L, as the model's forward without `position_ids` has them. A padding query
    /// that sees no key attends to nothing (zeros, as torch's SDPA gives).
    pub fn hidden_states(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
    ) -> Result<Vec<Tensor>, ModelError> {
        let (b, l) = input_ids.size2()?;
        if attention_mask.size() != [b, l] {
            return Err(ModelError::Input(format!(
                "Gemma-3 attention_mask must have the shape of input_ids {:?}, got {:?}",
                [b, l],
                attention_mask.size()
            )));
        }
        let weight = &self.embed_tokens.weight;
        let (device, kind) = (weight.device(), weight.kind());
        let scale = Tensor::from(self.config.hidden_size as f64).sqrt().to_kind(kind);
        let mut x =
            self.embed_tokens.forward(&input_ids.to_device(device)) * scale.to_device(device);
        let positions = Tensor::arange(l, (Kind::Float, device));
        let rotary = |rope: Rope| {
            let (cos, sin) = rotary(&positions, self.config.head_dim, rope);
            (cos.to_kind(kind), sin.to_kind(kind))
        };
        let full_rotary = rotary(self.config.full_rope);
        let sliding_rotary = rotary(self.config.sliding_rope);
        let query = Tensor::arange(l, (Kind::Int64, device)).view([l, 1]);
        let key = Tensor::arange(l, (Kind::Int64, device)).view([1, l]);
        let causal = key.le_tensor(&query);
        let window = key.gt_tensor(&(&query - self.config.sliding_window)).logical_and(&causal);
        let keys = attention_mask.to_device(device).to_kind(Kind::Bool).view([b, 1, 1, l]);
        let full_mask = Visible::new(causal.view([1, 1, l, l]).logical_and(&keys));
        let sliding_mask = Visible::new(window.view([1, 1, l, l]).logical_and(&keys));
        let mut states = Vec::with_capacity(self.layers.len() + 1);
        for layer in &self.layers {
            let (rope, mask) = match layer.kind {
                LayerKind::Full => (&full_rotary, &full_mask),
                LayerKind::Sliding => (&sliding_rotary, &sliding_mask),
            };
            let next = self.layer(layer, &x, rope, mask);
            states.push(x);
            x = next;
        }
        states.push(self.norm.forward(&x));
        Ok(states)
    }

    fn layer(
        &self,
        layer: &Layer,
        x: &Tensor,
        (cos, sin): &(Tensor, Tensor),
        mask: &Visible,
    ) -> Tensor {
        let c = &self.config;
        let (b, l, _) = x.size3().expect("(B, L, D)");
        let rotate = |t: &Tensor| {
            let half = c.head_dim / 2;
            let rotated = Tensor::cat(&[-t.narrow(3, half, half), t.narrow(3, 0, half)], 3);
            t * cos + rotated * sin
        };
        let heads = |t: Tensor, n: i64, norm: Option<&GemmaNorm>| {
            let t = t.view([b, l, n, c.head_dim]);
            norm.map_or(t.shallow_clone(), |m| m.forward(&t)).transpose(1, 2)
        };
        let h = layer.input_layernorm.forward(x);
        let q =
            rotate(&heads(layer.q_proj.forward(&h), c.num_attention_heads, Some(&layer.q_norm)));
        let k =
            rotate(&heads(layer.k_proj.forward(&h), c.num_key_value_heads, Some(&layer.k_norm)));
        let v = heads(layer.v_proj.forward(&h), c.num_key_value_heads, None);
        let repeat = c.num_attention_heads / c.num_key_value_heads;
        let (k, v) = if repeat > 1 {
            (
                k.repeat_interleave_self_int(repeat, 1, None),
                v.repeat_interleave_self_int(repeat, 1, None),
            )
        } else {
            (k, v)
        };
        let scale = c.query_pre_attn_scalar.powf(-0.5);
        let attn = attention(&q, &k, &v, Some(&mask.mask), false, Some(scale)) * &mask.rows;
        let attn = layer.o_proj.forward(&attn.transpose(1, 2).reshape([b, l, -1]));
        let x = x + layer.post_attention_layernorm.forward(&attn);
        let h = layer.pre_feedforward_layernorm.forward(&x);
        let h = gelu_tanh(&layer.gate_proj.forward(&h)) * layer.up_proj.forward(&h);
        let h = layer.down_proj.forward(&h);
        &x + layer.post_feedforward_layernorm.forward(&h)
    }
}

/// A boolean attention mask (B, 1, L, L) whose queries that see no key see every key instead,
/// and `rows` (B, 1, L, 1) that zeroes those queries' outputs afterwards: every attention kernel
/// then gives what torch's SDPA gives a fully masked row.
struct Visible {
    mask: Tensor,
    rows: Tensor,
}

impl Visible {
    fn new(mask: Tensor) -> Self {
        let any = mask.any_dim(-1, true);
        Self { mask: mask.logical_or(&any.logical_not()), rows: any }
    }
}

/// cos and sin (L, head_dim) of `positions` (L) f32, as transformers computes them in f32:
/// frequencies θ^(−2i/d), divided by the linear factor, repeated for both halves.
fn rotary(positions: &Tensor, dim: i64, rope: Rope) -> (Tensor, Tensor) {
    let device = positions.device();
    let exponents = Tensor::arange_start_step(0, dim, 2, (Kind::Float, device)) / dim as f64;
    let mut inv_freq = Tensor::pow_scalar(rope.theta, &exponents).reciprocal();
    if rope.factor != 1.0 {
        inv_freq /= rope.factor;
    }
    let freqs = positions.unsqueeze(-1) * inv_freq.unsqueeze(0);
    let angles = Tensor::cat(&[&freqs, &freqs], -1);
    (angles.cos(), angles.sin())
}
