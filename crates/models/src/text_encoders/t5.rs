//! `T5EncoderModel`: RMS-normed pre-LN encoder with bucketed relative position biases (computed
//! by the first block, shared by all) and a gated-GELU feed-forward; and `UMT5EncoderModel`
//! (`model_type: umt5`, Wan's text encoder), the same with a position bias table in every block.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::nn::{attention, Embedding, Linear, RmsNorm, Scope};
use crate::{read_config, ModelError};

/// Mirror of the transformers `T5Config` fields the encoder uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct T5Config {
    pub vocab_size: i64,
    pub d_model: i64,
    pub d_kv: i64,
    pub d_ff: i64,
    pub num_layers: usize,
    pub num_heads: i64,
    pub relative_attention_num_buckets: i64,
    pub relative_attention_max_distance: i64,
    pub layer_norm_epsilon: f64,
    pub feed_forward_proj: String,
    /// `t5` or `umt5` (every block has its own `relative_attention_bias`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_type: Option<String>,
}

impl Default for T5Config {
    fn default() -> Self {
        Self {
            vocab_size: 32128,
            d_model: 512,
            d_kv: 64,
            d_ff: 2048,
            num_layers: 6,
            num_heads: 8,
            relative_attention_num_buckets: 32,
            relative_attention_max_distance: 128,
            layer_norm_epsilon: 1e-6,
            feed_forward_proj: "relu".into(),
            model_type: None,
        }
    }
}

impl T5Config {
    /// Whether every block computes its own position bias (UMT5) rather than the first block's
    /// being shared (T5).
    pub fn bias_per_block(&self) -> bool {
        self.model_type.as_deref() == Some("umt5")
    }
}

struct Block {
    attn_norm: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ff_norm: RmsNorm,
    wi_0: Linear,
    wi_1: Option<Linear>,
    wo: Linear,
    /// `relative_attention_bias` of this block (the first block's, or every block's in UMT5).
    relative_attention_bias: Option<Embedding>,
}

/// The T5 or UMT5 encoder stack below `shared` and `encoder`.
pub struct T5Encoder {
    pub config: T5Config,
    shared: Embedding,
    blocks: Vec<Block>,
    final_layer_norm: RmsNorm,
    gated: bool,
    pub store: VarStore,
}

impl T5Encoder {
    /// The module tree of `config` with zero weights.
    pub fn new(config: &T5Config, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let gated = match config.feed_forward_proj.as_str() {
            "gated-gelu" => true,
            "relu" => false,
            other => {
                return Err(ModelError::Input(format!(
                    "T5 feed_forward_proj `{other}` is not supported; expected gated-gelu or relu"
                )))
            }
        };
        let store = super::store(device, kind);
        let root = Scope::root(store.root(), None);
        let (d, inner, eps) =
            (config.d_model, config.num_heads * config.d_kv, config.layer_norm_epsilon);
        let encoder = &root / "encoder";
        let blocks = (0..config.num_layers)
            .map(|i| {
                let layer = &(&(&encoder / "block") / i) / "layer";
                let (sa, ff) = (&layer / 0, &layer / 1);
                let attn = &sa / "SelfAttention";
                let dense = &ff / "DenseReluDense";
                let wi = |name: &str| (&dense / name).linear(d, config.d_ff, false);
                let with_bias = i == 0 || config.bias_per_block();
                Block {
                    attn_norm: RmsNorm::new(&(&sa / "layer_norm"), d, eps),
                    q: (&attn / "q").linear(d, inner, false),
                    k: (&attn / "k").linear(d, inner, false),
                    v: (&attn / "v").linear(d, inner, false),
                    o: (&attn / "o").linear(inner, d, false),
                    ff_norm: RmsNorm::new(&(&ff / "layer_norm"), d, eps),
                    wi_0: if gated { wi("wi_0") } else { wi("wi") },
                    wi_1: gated.then(|| wi("wi_1")),
                    wo: (&dense / "wo").linear(config.d_ff, d, false),
                    relative_attention_bias: with_bias.then(|| {
                        Embedding::new(
                            &(&attn / "relative_attention_bias"),
                            config.relative_attention_num_buckets,
                            config.num_heads,
                        )
                    }),
                }
            })
            .collect();
        Ok(Self {
            shared: Embedding::new(&(&root / "shared"), config.vocab_size, d),
            blocks,
            final_layer_norm: RmsNorm::new(&(&encoder / "final_layer_norm"), d, eps),
            gated,
            config: config.clone(),
            store,
        })
    }

    /// Loads a transformers directory (`config.json` + safetensors); UMT5's copy of the
    /// embedding under `encoder.embed_tokens` (tied to `shared`) is skipped.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let config: T5Config = read_config(&dir.join("config.json"))?;
        let mut model = Self::new(&config, device, kind)?;
        super::load_frozen(&mut model.store, dir, kind, &["encoder.embed_tokens."], &[])?;
        Ok(model)
    }

    /// Position bias (1, heads, L, L) of `table` from bidirectional relative-position buckets.
    fn position_bias(&self, table: &Embedding, len: i64, device: Device) -> Tensor {
        let pos = Tensor::arange(len, (Kind::Int64, device));
        let relative = pos.unsqueeze(0) - pos.unsqueeze(1);
        let buckets = relative_position_bucket(
            &relative,
            self.config.relative_attention_num_buckets,
            self.config.relative_attention_max_distance,
        );
        table.forward(&buckets).permute([2, 0, 1]).unsqueeze(0)
    }

    /// `last_hidden_state` (B, L, d_model) for token ids (B, L); no attention mask, as SD3 encodes.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor, ModelError> {
        self.forward_masked(ids, None)
    }

    /// As [`Self::forward`] with an attention mask (B, L) (nonzero: a real token): padded
    /// positions are not attended to (their own states are still computed), as transformers
    /// does with `attention_mask`.
    pub fn forward_masked(
        &self,
        ids: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<Tensor, ModelError> {
        let (b, l) = ids.size2().map_err(|_| {
            ModelError::Input(format!("T5 input_ids must be (B, L), got {:?}", ids.size()))
        })?;
        if let Some(m) = mask.filter(|m| m.size() != [b, l]) {
            return Err(ModelError::Input(format!(
                "T5 attention_mask has shape {:?}, expected [{b}, {l}]",
                m.size()
            )));
        }
        let mut x = self.shared.forward(ids);
        let padding = mask.map(|m| {
            let hidden = m.eq(0).view([b, 1, 1, l]);
            Tensor::zeros([b, 1, 1, l], (x.kind(), x.device()))
                .masked_fill(&hidden, f64::NEG_INFINITY)
        });
        let heads = self.config.num_heads;
        let mut bias: Option<Tensor> = None;
        for block in &self.blocks {
            if let Some(table) = &block.relative_attention_bias {
                let position = self.position_bias(table, l, ids.device()).to_kind(x.kind());
                bias = Some(match &padding {
                    Some(p) => position + p,
                    None => position,
                });
            }
            let bias = bias.as_ref().expect("the first block has a position bias table");
            let h = block.attn_norm.forward(&x).to_kind(x.kind());
            let split = |t: Tensor| t.view([b, l, heads, -1]).transpose(1, 2);
            let (q, k, v) = (
                split(block.q.forward(&h)),
                split(block.k.forward(&h)),
                split(block.v.forward(&h)),
            );
            // T5 does not scale scores by 1/√d: scale 1 with the bias as an additive mask.
            let attn = attention(&q, &k, &v, Some(bias), false, Some(1.0));
            x = &x + block.o.forward(&attn.transpose(1, 2).reshape([b, l, -1]));
            let h = block.ff_norm.forward(&x).to_kind(x.kind());
            let hidden = match &block.wi_1 {
                Some(wi_1) if self.gated => block.wi_0.forward(&h).gelu("tanh") * wi_1.forward(&h),
                _ => block.wi_0.forward(&h).relu(),
            };
            x = &x + block.wo.forward(&hidden);
        }
        Ok(self.final_layer_norm.forward(&x))
    }
}

/// T5's bidirectional bucketing: half the buckets per direction, exact for small distances,
/// logarithmic up to `max_distance`.
fn relative_position_bucket(relative: &Tensor, num_buckets: i64, max_distance: i64) -> Tensor {
    let half = num_buckets / 2;
    let direction = relative.gt(0).to_kind(Kind::Int64) * half;
    let distance = relative.abs();
    let max_exact = half / 2;
    let is_small = distance.lt(max_exact);
    let scaled = (distance.clamp_min(1).to_kind(Kind::Float) / max_exact as f64).log()
        / ((max_distance as f64) / max_exact as f64).ln()
        * (half - max_exact) as f64;
    let large = (scaled.to_kind(Kind::Int64) + max_exact).clamp_max(half - 1);
    direction + distance.where_self(&is_small, &large)
}
