//! `LTX2TextConnectors`: LTX-2's text features from the Gemma-3 hidden states of every layer
//! (the pipeline's `prompt_embeds`, (B, L, caption_channels · text_proj_in_factor)) to the video
//! and audio context of the transformer. LTX-2.0 normalizes each layer by its masked mean and
//! range and projects once (`text_proj_in`); LTX-2.3 RMS-normalizes each token's layers and
//! projects per modality (`video_text_proj_in`, `audio_text_proj_in`). Each modality then runs a
//! 1-D connector transformer whose learnable registers replace the padding.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::nn::{attention, FeedForward, Linear, Scope};
use crate::text_encoders::gemma3::prompts::Gemma3PromptEncoder;
pub use crate::text_encoders::gemma3::prompts::MAX_SEQUENCE_LENGTH;
use crate::weights::{checkpoint_files, load_weights, LoadOptions};
use crate::{read_config, ModelError};

/// `scale_factor` of the pipeline's call (LTX-2.0's masked normalization).
pub const SCALE_FACTOR: f64 = 8.0;

/// `config.json` of `LTX2TextConnectors`, with diffusers' defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Ltx2ConnectorsConfig {
    pub caption_channels: i64,
    pub text_proj_in_factor: i64,
    pub video_connector_num_attention_heads: i64,
    pub video_connector_attention_head_dim: i64,
    pub video_connector_num_layers: usize,
    pub video_connector_num_learnable_registers: Option<i64>,
    pub video_gated_attn: bool,
    pub audio_connector_num_attention_heads: i64,
    pub audio_connector_attention_head_dim: i64,
    pub audio_connector_num_layers: usize,
    pub audio_connector_num_learnable_registers: Option<i64>,
    pub audio_gated_attn: bool,
    pub connector_rope_base_seq_len: i64,
    pub rope_theta: f64,
    pub rope_double_precision: bool,
    /// Stored by diffusers and never read: it changes nothing.
    pub causal_temporal_positioning: bool,
    pub rope_type: String,
    pub per_modality_projections: bool,
    pub video_hidden_dim: i64,
    pub audio_hidden_dim: i64,
    pub proj_bias: bool,
}

impl Default for Ltx2ConnectorsConfig {
    fn default() -> Self {
        Self {
            caption_channels: 3840,
            text_proj_in_factor: 49,
            video_connector_num_attention_heads: 30,
            video_connector_attention_head_dim: 128,
            video_connector_num_layers: 2,
            video_connector_num_learnable_registers: Some(128),
            video_gated_attn: false,
            audio_connector_num_attention_heads: 30,
            audio_connector_attention_head_dim: 128,
            audio_connector_num_layers: 2,
            audio_connector_num_learnable_registers: Some(128),
            audio_gated_attn: false,
            connector_rope_base_seq_len: 4096,
            rope_theta: 10_000.0,
            rope_double_precision: true,
            causal_temporal_positioning: false,
            rope_type: "interleaved".into(),
            per_modality_projections: false,
            video_hidden_dim: 4096,
            audio_hidden_dim: 2048,
            proj_bias: false,
        }
    }
}

/// Keys of the config (beside `_class_name`-style metadata).
const KNOWN_KEYS: &[&str] = &[
    "caption_channels",
    "text_proj_in_factor",
    "video_connector_num_attention_heads",
    "video_connector_attention_head_dim",
    "video_connector_num_layers",
    "video_connector_num_learnable_registers",
    "video_gated_attn",
    "audio_connector_num_attention_heads",
    "audio_connector_attention_head_dim",
    "audio_connector_num_layers",
    "audio_connector_num_learnable_registers",
    "audio_gated_attn",
    "connector_rope_base_seq_len",
    "rope_theta",
    "rope_double_precision",
    "causal_temporal_positioning",
    "rope_type",
    "per_modality_projections",
    "video_hidden_dim",
    "audio_hidden_dim",
    "proj_bias",
];

impl Ltx2ConnectorsConfig {
    /// Reads `config.json`, refusing unknown keys and unsupported values by key name.
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        let bad =
            |message: String| ModelError::Format { path: path.display().to_string(), message };
        let value: serde_json::Value = read_config(path)?;
        if let Some(map) = value.as_object() {
            let unknown: Vec<&String> = map
                .keys()
                .filter(|k| !k.starts_with('_') && !KNOWN_KEYS.contains(&k.as_str()))
                .collect();
            if !unknown.is_empty() {
                return Err(bad(format!("unsupported LTX2TextConnectors keys {unknown:?}")));
            }
        }
        let config: Self = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
        config.check().map_err(bad)?;
        Ok(config)
    }

    /// Refuses values the connectors do not run, by key name.
    pub fn check(&self) -> Result<(), String> {
        if self.rope_type != "interleaved" && self.rope_type != "split" {
            return Err(format!("rope_type `{}`: expected interleaved or split", self.rope_type));
        }
        let (video_in, audio_in) = self.connector_inputs();
        for (side, heads, head_dim, registers, input, input_key) in [
            (
                "video",
                self.video_connector_num_attention_heads,
                self.video_connector_attention_head_dim,
                self.video_connector_num_learnable_registers,
                video_in,
                if self.per_modality_projections { "video_hidden_dim" } else { "caption_channels" },
            ),
            (
                "audio",
                self.audio_connector_num_attention_heads,
                self.audio_connector_attention_head_dim,
                self.audio_connector_num_learnable_registers,
                audio_in,
                if self.per_modality_projections { "audio_hidden_dim" } else { "caption_channels" },
            ),
        ] {
            if heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 {
                return Err(format!(
                    "{side}_connector_num_attention_heads {heads} / \
                     {side}_connector_attention_head_dim {head_dim}: expected positive sizes and \
                     an even head dim"
                ));
            }
            if heads * head_dim != input {
                return Err(format!(
                    "{side}_connector_num_attention_heads × {side}_connector_attention_head_dim = \
                     {} must equal {input_key} {input}",
                    heads * head_dim
                ));
            }
            if registers.is_some_and(|r| r <= 0) {
                return Err(format!(
                    "{side}_connector_num_learnable_registers {registers:?}: expected a positive \
                     count or null"
                ));
            }
        }
        if self.caption_channels <= 0 || self.text_proj_in_factor <= 0 {
            return Err(format!(
                "caption_channels {} / text_proj_in_factor {}: expected positive sizes",
                self.caption_channels, self.text_proj_in_factor
            ));
        }
        Ok(())
    }

    /// Widths the video and audio connectors take.
    fn connector_inputs(&self) -> (i64, i64) {
        if self.per_modality_projections {
            (self.video_hidden_dim, self.audio_hidden_dim)
        } else {
            (self.caption_channels, self.caption_channels)
        }
    }
}

/// Which side the tokenizer padded (`padding_side`; LTX-2.0's normalization reads it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaddingSide {
    Left,
    Right,
}

/// Rotary layout of the connectors' attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RopeType {
    /// Pairs of neighbouring channels over the whole inner width.
    Interleaved,
    /// First and second halves of each head.
    Split,
}

/// RMS norm over the last dimension without a scale (`torch.nn.RMSNorm(elementwise_affine=False)`),
/// computed in f32 and returned in the input's kind.
fn rms(x: &Tensor, eps: f64) -> Tensor {
    let xf = x.to_kind(Kind::Float);
    (&xf * (xf.square().mean_dim(-1, true, Kind::Float) + eps).rsqrt()).to_kind(x.kind())
}

/// `torch.nn.RMSNorm(dim, eps=1e-6)` with a scale.
struct ScaledRms {
    weight: Tensor,
}

impl ScaledRms {
    fn forward(&self, x: &Tensor) -> Tensor {
        rms(x, 1e-6) * &self.weight
    }
}

struct Attention {
    heads: i64,
    to_q: Linear,
    to_k: Linear,
    to_v: Linear,
    to_out: Linear,
    norm_q: ScaledRms,
    norm_k: ScaledRms,
    to_gate_logits: Option<Linear>,
}

impl Attention {
    fn new(scope: &Scope<'_>, dim: i64, heads: i64, gated: bool) -> Self {
        let norm = |name: &str| ScaledRms { weight: (scope / name).var("weight", &[dim]) };
        Self {
            heads,
            to_q: (scope / "to_q").linear(dim, dim, true),
            to_k: (scope / "to_k").linear(dim, dim, true),
            to_v: (scope / "to_v").linear(dim, dim, true),
            to_out: (&(scope / "to_out") / 0).linear(dim, dim, true),
            norm_q: norm("norm_q"),
            norm_k: norm("norm_k"),
            to_gate_logits: gated.then(|| (scope / "to_gate_logits").linear(dim, heads, true)),
        }
    }

    /// Self-attention of `x` (B, L, D) under the additive `mask` (B, 1, 1, L), rotary `rope`.
    fn forward(&self, x: &Tensor, mask: &Tensor, rope: &Rotary) -> Tensor {
        let (b, l, d) = x.size3().expect("(B, L, D)");
        let q = rope.apply(&self.norm_q.forward(&self.to_q.forward(x)), self.heads);
        let k = rope.apply(&self.norm_k.forward(&self.to_k.forward(x)), self.heads);
        let v = self.to_v.forward(x);
        let heads = |t: Tensor| t.view([b, l, self.heads, -1]).transpose(1, 2);
        let out =
            attention(&heads(q), &heads(k), &heads(v), Some(mask), false, None).transpose(1, 2);
        let out = match &self.to_gate_logits {
            Some(gate) => out * (gate.forward(x).sigmoid() * 2.0).unsqueeze(-1),
            None => out,
        };
        self.to_out.forward(&out.reshape([b, l, d]))
    }
}

/// cos and sin of the connectors' 1-D positions: (B, L, D) interleaved or (B, H, L, D/H/2) split.
struct Rotary {
    kind: RopeType,
    cos: Tensor,
    sin: Tensor,
}

impl Rotary {
    /// Positions 0‥L as fractions of `base` mapped to [−1, 1), frequencies θ^linspace(0, 1) · π/2
    /// (computed in f64 when `double`, then f32).
    fn new(
        kind: RopeType,
        dim: i64,
        heads: i64,
        (l, base, theta, double): (i64, i64, f64, bool),
        device: Device,
    ) -> Self {
        let grid = Tensor::arange(l, (Kind::Float, device)) / base as f64;
        let steps = dim / 2;
        let precision = if double { Kind::Double } else { Kind::Float };
        let exponents = Tensor::linspace(0.0, 1.0, steps, (precision, device));
        let freqs = (Tensor::pow_scalar(theta, &exponents) * (std::f64::consts::PI / 2.0))
            .to_kind(Kind::Float);
        let freqs = (grid.unsqueeze(-1) * 2.0 - 1.0) * freqs.unsqueeze(0);
        let (cos, sin) = (freqs.cos().unsqueeze(0), freqs.sin().unsqueeze(0));
        match kind {
            RopeType::Interleaved => Self {
                kind,
                cos: cos.repeat_interleave_self_int(2, -1, None),
                sin: sin.repeat_interleave_self_int(2, -1, None),
            },
            RopeType::Split => {
                let per_head = |t: Tensor| t.view([1, l, heads, -1]).transpose(1, 2);
                Self { kind, cos: per_head(cos), sin: per_head(sin) }
            }
        }
    }

    /// `x` (B, L, D) rotated, computed in f32 and returned in its kind.
    fn apply(&self, x: &Tensor, heads: i64) -> Tensor {
        let (b, l, d) = x.size3().expect("(B, L, D)");
        let xf = x.to_kind(Kind::Float);
        let out = match self.kind {
            RopeType::Interleaved => {
                let pairs = xf.view([b, l, d / 2, 2]);
                let (real, imag) = (pairs.select(-1, 0), pairs.select(-1, 1));
                let rotated = Tensor::stack(&[-imag, real], -1).view([b, l, d]);
                &xf * &self.cos + rotated * &self.sin
            }
            RopeType::Split => {
                let xh = xf.view([b, l, heads, -1]).transpose(1, 2);
                let r = d / heads / 2;
                let (first, second) = (xh.narrow(-1, 0, r), xh.narrow(-1, r, r));
                let out_first = &first * &self.cos - &second * &self.sin;
                let out_second = &second * &self.cos + &first * &self.sin;
                Tensor::cat(&[out_first, out_second], -1).transpose(1, 2).reshape([b, l, d])
            }
        };
        out.to_kind(x.kind())
    }
}

struct Block {
    attn1: Attention,
    ff: FeedForward,
}

/// `LTX2ConnectorTransformer1d`.
struct Connector {
    dim: i64,
    heads: i64,
    learnable_registers: Option<Tensor>,
    blocks: Vec<Block>,
}

impl Connector {
    fn new(
        scope: &Scope<'_>,
        (heads, head_dim, layers): (i64, i64, usize),
        registers: Option<i64>,
        gated: bool,
    ) -> Self {
        let dim = heads * head_dim;
        let blocks = (0..layers)
            .map(|i| {
                let block = &(scope / "transformer_blocks") / i;
                Block {
                    attn1: Attention::new(&(&block / "attn1"), dim, heads, gated),
                    ff: FeedForward::new(&(&block / "ff"), dim),
                }
            })
            .collect();
        Self {
            dim,
            heads,
            learnable_registers: registers.map(|r| scope.var("learnable_registers", &[r, dim])),
            blocks,
        }
    }

    /// The connector's output (B, L, D) of `x` (B, L, D) under the additive `mask` (B, 1, 1, L),
    /// and the mask it leaves (zeros where registers replaced the padding).
    fn forward(
        &self,
        x: &Tensor,
        mask: &Tensor,
        rope: (RopeType, i64, f64, bool),
    ) -> Result<(Tensor, Tensor), ModelError> {
        let (b, l, d) = x.size3()?;
        let (mut x, mask) = match &self.learnable_registers {
            Some(registers) => {
                let count = registers.size()[0];
                if l % count != 0 {
                    return Err(ModelError::Input(format!(
                        "LTX-2 connector: sequence length {l} is not a multiple of its {count} \
                         learnable registers"
                    )));
                }
                let tiled = registers.repeat([l / count, 1]).to_kind(x.kind());
                let valid = mask.ge(-9000.0).view([b, l]).to_kind(Kind::Int64);
                let order = (valid.neg() + 1).argsort_stable(true, 1, false);
                let front = x.gather(1, &order.unsqueeze(-1).expand([b, l, d], false), false);
                let count_valid = valid.sum_dim_intlist(1, true, Kind::Int64);
                let positions = Tensor::arange(l, (Kind::Int64, x.device())).unsqueeze(0);
                let keep = positions.lt_tensor(&count_valid).unsqueeze(-1);
                (front.where_self(&keep, &tiled.unsqueeze(0)), mask.zeros_like())
            }
            None => (x.shallow_clone(), mask.shallow_clone()),
        };
        let (kind, base, theta, double) = rope;
        let rotary = Rotary::new(kind, self.dim, self.heads, (l, base, theta, double), x.device());
        for block in &self.blocks {
            x = &x + block.attn1.forward(&rms(&x, 1e-6), &mask, &rotary);
            x = &x + block.ff.forward(&rms(&x, 1e-6));
        }
        Ok((rms(&x, 1e-6), mask))
    }
}

/// `LTX2TextConnectors`.
pub struct Ltx2TextConnectors {
    pub config: Ltx2ConnectorsConfig,
    /// `text_proj_in` (LTX-2.0), or `video_text_proj_in` and `audio_text_proj_in` (LTX-2.3).
    projections: Projections,
    video_connector: Connector,
    audio_connector: Connector,
    pub store: VarStore,
}

enum Projections {
    Shared(Linear),
    PerModality { video: Linear, audio: Linear },
}

/// The video context, the audio context (B, L, D each) and the mask (B, L) i64 the pipeline
/// passes the transformer.
pub struct ConnectorOutput {
    pub video: Tensor,
    pub audio: Tensor,
    pub mask: Tensor,
}

impl Ltx2TextConnectors {
    /// Variables for `config` (uninitialised until loaded).
    pub fn new(
        config: &Ltx2ConnectorsConfig,
        device: Device,
        kind: Kind,
    ) -> Result<Self, ModelError> {
        config
            .check()
            .map_err(|message| ModelError::Format { path: "LTX2TextConnectors".into(), message })?;
        let c = config;
        let store = crate::weights::store(device, kind);
        let root = Scope::root(store.root(), None);
        let input = c.caption_channels * c.text_proj_in_factor;
        let projections = if c.per_modality_projections {
            Projections::PerModality {
                video: (&root / "video_text_proj_in").linear(
                    input,
                    c.video_hidden_dim,
                    c.proj_bias,
                ),
                audio: (&root / "audio_text_proj_in").linear(
                    input,
                    c.audio_hidden_dim,
                    c.proj_bias,
                ),
            }
        } else {
            Projections::Shared((&root / "text_proj_in").linear(
                input,
                c.caption_channels,
                c.proj_bias,
            ))
        };
        let video_connector = Connector::new(
            &(&root / "video_connector"),
            (
                c.video_connector_num_attention_heads,
                c.video_connector_attention_head_dim,
                c.video_connector_num_layers,
            ),
            c.video_connector_num_learnable_registers,
            c.video_gated_attn,
        );
        let audio_connector = Connector::new(
            &(&root / "audio_connector"),
            (
                c.audio_connector_num_attention_heads,
                c.audio_connector_attention_head_dim,
                c.audio_connector_num_layers,
            ),
            c.audio_connector_num_learnable_registers,
            c.audio_gated_attn,
        );
        Ok(Self { config: config.clone(), projections, video_connector, audio_connector, store })
    }

    /// Loads a diffusers `connectors/` folder (`config.json` + safetensors), frozen; a missing or
    /// unexpected tensor is an error naming it.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let config = Ltx2ConnectorsConfig::load(&dir.join("config.json"))?;
        let mut model = Self::new(&config, device, kind)?;
        let options = LoadOptions { kind: Some(kind), ..Default::default() };
        load_weights(&mut model.store, &checkpoint_files(dir)?, options)?;
        model.store.freeze();
        Ok(model)
    }

    /// The pipeline's `encode_prompt` then `connectors(…, padding_side="left")` for `prompts`:
    /// Gemma-3's prompt embeddings of `max_sequence_length` tokens (the pipeline's default is
    /// [`MAX_SEQUENCE_LENGTH`]) through the connectors.
    pub fn encode_prompts(
        &self,
        encoder: &Gemma3PromptEncoder,
        prompts: &[&str],
        max_sequence_length: usize,
    ) -> Result<ConnectorOutput, ModelError> {
        let (embeds, mask) = encoder.encode(prompts, max_sequence_length)?;
        self.forward(&embeds, &mask, PaddingSide::Left)
    }

    /// `LTX2TextConnectors.forward(prompt_embeds, attention_mask, padding_side)` with the default
    /// scale factor: `prompt_embeds` (B, L, caption_channels · text_proj_in_factor), stacked per
    /// channel over the layers as the pipeline flattens them (moved to the connectors' device
    /// and kind), `attention_mask` (B, L) of ones and zeros.
    pub fn forward(
        &self,
        prompt_embeds: &Tensor,
        attention_mask: &Tensor,
        padding_side: PaddingSide,
    ) -> Result<ConnectorOutput, ModelError> {
        let c = &self.config;
        let (b, l, width) = prompt_embeds.size3()?;
        if width != c.caption_channels * c.text_proj_in_factor || attention_mask.size() != [b, l] {
            return Err(ModelError::Input(format!(
                "LTX-2 connectors take prompt embeds (B, L, {} · {}) and a (B, L) mask, got {:?} \
                 and {:?}",
                c.caption_channels,
                c.text_proj_in_factor,
                prompt_embeds.size(),
                attention_mask.size()
            )));
        }
        let weight = match &self.projections {
            Projections::Shared(proj) => &proj.weight,
            Projections::PerModality { video, .. } => &video.weight,
        };
        let device = weight.device();
        let prompt_embeds = prompt_embeds.to_device(device).to_kind(weight.kind());
        let mask = attention_mask.to_device(device);
        let states = prompt_embeds.view([b, l, c.caption_channels, c.text_proj_in_factor]);
        let (video_in, audio_in) = match &self.projections {
            Projections::PerModality { video, audio } => {
                let normed = (&states
                    * (states.square().mean_dim(2, true, states.kind()) + 1e-6).rsqrt())
                .flatten(2, 3);
                let kept = mask.to_kind(Kind::Bool).unsqueeze(-1);
                let normed = normed.where_self(&kept, &normed.zeros_like());
                let scale = |dim: i64| (dim as f64 / c.caption_channels as f64).sqrt();
                (
                    video.forward(&(&normed * scale(c.video_hidden_dim))),
                    audio.forward(&(&normed * scale(c.audio_hidden_dim))),
                )
            }
            Projections::Shared(proj) => {
                let normed = masked_mean_norm(&states, &mask, padding_side);
                let projected = proj.forward(&normed);
                (projected.shallow_clone(), projected)
            }
        };
        let kind = video_in.kind();
        let max = match kind {
            Kind::Half => 65_504.0,
            Kind::BFloat16 => 3.389_531_389_251_535_5e38,
            Kind::Double => f64::MAX,
            _ => f64::from(f32::MAX),
        };
        let additive = ((mask.to_kind(Kind::Int64) - 1).to_kind(kind) * max).view([b, 1, 1, l]);
        let rope_type =
            if c.rope_type == "split" { RopeType::Split } else { RopeType::Interleaved };
        let rope =
            (rope_type, c.connector_rope_base_seq_len, c.rope_theta, c.rope_double_precision);
        let (video, video_mask) = self.video_connector.forward(&video_in, &additive, rope)?;
        let kept = video_mask.lt(1e-6).to_kind(Kind::Int64).view([b, l, 1]);
        let video = video * &kept;
        let (audio, _) = self.audio_connector.forward(&audio_in, &additive, rope)?;
        Ok(ConnectorOutput { video, audio, mask: kept.view([b, l]) })
    }
}

/// LTX-2.0's per-layer normalization of `states` (B, L, C, layers): each sample's layer minus its
/// mean over the valid tokens and channels, over its range there, times [`SCALE_FACTOR`];
/// flattened to (B, L, C · layers) with the padding zeroed. The valid tokens are the last (left
/// padding) or first `mask.sum()` of each row.
fn masked_mean_norm(states: &Tensor, mask: &Tensor, side: PaddingSide) -> Tensor {
    let (b, l, c, _) = states.size4().expect("(B, L, C, layers)");
    let lengths = mask.sum_dim_intlist(-1, false, Kind::Int64).view([b, 1]);
    let index = Tensor::arange(l, (Kind::Int64, states.device())).view([1, l]);
    let valid = match side {
        PaddingSide::Left => index.ge_tensor(&(lengths.shallow_clone() * -1 + l)),
        PaddingSide::Right => index.lt_tensor(&lengths),
    }
    .view([b, l, 1, 1]);
    let invalid = valid.logical_not();
    let count = (lengths * c).view([b, 1, 1, 1]).to_kind(Kind::Float) + 1e-6;
    let sum =
        states.masked_fill(&invalid, 0.0).sum_dim_intlist([1, 2].as_slice(), true, states.kind());
    let mean = sum / count;
    let low = states.masked_fill(&invalid, f64::INFINITY).amin([1, 2].as_slice(), true);
    let high = states.masked_fill(&invalid, f64::NEG_INFINITY).amax([1, 2].as_slice(), true);
    let normed = (states - mean) / (high - low + 1e-6) * SCALE_FACTOR;
    normed.flatten(2, 3).masked_fill(&invalid.view([b, l, 1]), 0.0).to_kind(states.kind())
}

impl Ltx2ConnectorsConfig {
    /// A tiny config over `caption_channels` × `text_proj_in_factor` features: LTX-2.0's layout
    /// (one shared projection, interleaved rotary, registers on the video side only) or, with
    /// `ltx23`, LTX-2.3's (per-modality projections with biases, split rotary, gated attention,
    /// registers on both sides, single-precision rotary frequencies).
    pub fn tiny(caption_channels: i64, text_proj_in_factor: i64, ltx23: bool) -> Self {
        let base = Self {
            caption_channels,
            text_proj_in_factor,
            connector_rope_base_seq_len: 32,
            ..Self::default()
        };
        let head_dim = 8;
        if ltx23 {
            Self {
                video_connector_num_attention_heads: 3,
                video_connector_attention_head_dim: head_dim,
                video_connector_num_layers: 2,
                video_connector_num_learnable_registers: Some(8),
                video_gated_attn: true,
                audio_connector_num_attention_heads: 2,
                audio_connector_attention_head_dim: head_dim,
                audio_connector_num_layers: 1,
                audio_connector_num_learnable_registers: Some(4),
                audio_gated_attn: true,
                rope_double_precision: false,
                rope_type: "split".into(),
                per_modality_projections: true,
                video_hidden_dim: 3 * head_dim,
                audio_hidden_dim: 2 * head_dim,
                proj_bias: true,
                ..base
            }
        } else {
            let heads = caption_channels / head_dim;
            Self {
                video_connector_num_attention_heads: heads,
                video_connector_attention_head_dim: head_dim,
                video_connector_num_layers: 2,
                video_connector_num_learnable_registers: Some(4),
                audio_connector_num_attention_heads: heads,
                audio_connector_attention_head_dim: head_dim,
                audio_connector_num_layers: 1,
                audio_connector_num_learnable_registers: None,
                ..base
            }
        }
    }
}

/// Writes a diffusers `connectors/` folder for `config` (`config.json`,
/// `diffusion_pytorch_model.safetensors`) with N(0, 0.1²) weights (norm scales around 1) from
/// `seed`.
pub fn write_tiny_ltx2_connectors(
    dir: &Path,
    seed: u64,
    config: &Ltx2ConnectorsConfig,
) -> Result<(), ModelError> {
    use crate::sd3::tiny::{randomize, write_model};
    use crate::sd3::WeightInit;
    let model = Ltx2TextConnectors::new(config, Device::Cpu, Kind::Float)?;
    let mut rng = flowtune_sampling::SampleRng::new(seed);
    randomize(&model.store, &mut rng, WeightInit::Normal(0.1))?;
    let mut json = serde_json::to_value(config).expect("config");
    json["_class_name"] = serde_json::json!("LTX2TextConnectors");
    write_model(dir, &model.store, &json)
}
