//! The decoder stack shared by the Qwen language models (Qwen2.5-VL's, Qwen3): pre-norm layers
//! with grouped-query attention under a causal and padding mask, rotary positions (multimodal
//! sections, or one section for plain text) and a SwiGLU MLP. Qwen3 adds per-head RMS norms on
//! queries and keys, drops the q/k/v biases and may set the head width explicitly; Qwen3-VL
//! interleaves its rotary sections and adds deepstack visual features after the first layers.

use tch::{Kind, Tensor};

use super::qwen2_5_vl_positions::text_positions;
use crate::nn::{attention, grouped_attention, Embedding, Linear, RmsNorm, Scope};
use crate::ModelError;

/// `rope_parameters` (transformers 5) or `rope_scaling` of a text config: θ and the rotary kind.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub(crate) struct RopeFields {
    rope_theta: Option<f64>,
    rope_type: Option<String>,
}

/// θ of plain rotary positions from `parameters`, else `scaling`, else the flat `rope_theta`
/// (10 000 when none gives it); another rotary kind is refused.
pub(crate) fn plain_rope_theta(
    parameters: Option<RopeFields>,
    scaling: Option<RopeFields>,
    flat: Option<f64>,
) -> Result<f64, String> {
    let rope = parameters.or(scaling).unwrap_or_default();
    if let Some(kind) = rope.rope_type.as_deref().filter(|k| *k != "default") {
        return Err(format!("rope type `{kind}` is not supported; expected default"));
    }
    Ok(rope.rope_theta.or(flat).unwrap_or(10_000.0))
}

/// Sizes and switches of a decoder stack.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderShape {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub head_dim: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    /// Biases on the query, key and value projections (Qwen2.5-VL).
    pub qkv_bias: bool,
    /// `q_norm` / `k_norm` over each head (Qwen3).
    pub qk_norm: bool,
}

/// Which position row (temporal, height, width) rotates each rotary frequency.
#[derive(Debug, Clone, Copy)]
pub enum Mrope<'a> {
    /// Consecutive groups of `section[i]` frequencies rotate by row `i`, summing to all of them
    /// (Qwen2.5-VL; one section is plain 1-D text).
    Chunked(&'a [i64]),
    /// Qwen3-VL's interleaving: frequency `f` rotates by row 1 when `f % 3 == 1` and
    /// `f < 3·section[1]`, by row 2 when `f % 3 == 2` and `f < 3·section[2]`, else by row 0.
    Interleaved(&'a [i64]),
}

impl Mrope<'_> {
    /// The row of each of `half` frequencies.
    fn rows(self, half: i64) -> Vec<i64> {
        match self {
            Mrope::Chunked(section) => section
                .iter()
                .enumerate()
                .flat_map(|(row, &n)| std::iter::repeat_n(row as i64, n as usize))
                .collect(),
            Mrope::Interleaved(section) => (0..half)
                .map(|f| match f % 3 {
                    1 if f < 3 * section[1] => 1,
                    2 if f < 3 * section[2] => 2,
                    _ => 0,
                })
                .collect(),
        }
    }
}

/// Visual features added to the states of the image tokens after layer `k` for each `k` of
/// `features` (Qwen3-VL's deepstack): `slots` (B, L) bool marks the image tokens, each feature is
/// (their count, hidden) in row-major order.
pub struct Deepstack<'a> {
    pub slots: &'a Tensor,
    pub features: &'a [Tensor],
}

impl Deepstack<'_> {
    /// `x` (B, L, D) after layer `done`, with that layer's feature added to the image tokens.
    fn add_after(&self, done: usize, x: Tensor) -> Tensor {
        let Some(feature) = self.features.get(done) else { return x };
        let slots = self.slots.unsqueeze(-1);
        let added = x.masked_select(&slots).view([-1, x.size()[2]]) + feature.to_kind(x.kind());
        x.masked_scatter(&slots, &added)
    }
}

struct Layer {
    input_layernorm: RmsNorm,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    post_attention_layernorm: RmsNorm,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

/// `embed_tokens`, `layers.N.…` and `norm` below a model scope.
pub struct QwenDecoder {
    pub shape: DecoderShape,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
}

impl QwenDecoder {
    /// Variables of `shape` below `model` (zeros until loaded).
    pub fn new(model: &Scope<'_>, shape: &DecoderShape) -> Self {
        let s = shape;
        let (d, eps) = (s.hidden_size, s.rms_norm_eps);
        let (q, kv) = (s.num_attention_heads * s.head_dim, s.num_key_value_heads * s.head_dim);
        let layers = (0..s.num_hidden_layers)
            .map(|i| {
                let layer = &(model / "layers") / i;
                let (attn, mlp) = (&layer / "self_attn", &layer / "mlp");
                let head_norm =
                    |name: &str| s.qk_norm.then(|| RmsNorm::new(&(&attn / name), s.head_dim, eps));
                Layer {
                    input_layernorm: RmsNorm::new(&(&layer / "input_layernorm"), d, eps),
                    q_proj: (&attn / "q_proj").linear(d, q, s.qkv_bias),
                    k_proj: (&attn / "k_proj").linear(d, kv, s.qkv_bias),
                    v_proj: (&attn / "v_proj").linear(d, kv, s.qkv_bias),
                    o_proj: (&attn / "o_proj").linear(q, d, false),
                    q_norm: head_norm("q_norm"),
                    k_norm: head_norm("k_norm"),
                    post_attention_layernorm: RmsNorm::new(
                        &(&layer / "post_attention_layernorm"),
                        d,
                        eps,
                    ),
                    gate_proj: (&mlp / "gate_proj").linear(d, s.intermediate_size, false),
                    up_proj: (&mlp / "up_proj").linear(d, s.intermediate_size, false),
                    down_proj: (&mlp / "down_proj").linear(s.intermediate_size, d, false),
                }
            })
            .collect();
        Self {
            embed_tokens: Embedding::new(&(model / "embed_tokens"), s.vocab_size, d),
            layers,
            norm: RmsNorm::new(&(model / "norm"), d, eps),
            shape: shape.clone(),
        }
    }

    /// Token embeddings (B, L, D) of `ids` (B, L).
    pub fn embed(&self, ids: &Tensor) -> Tensor {
        self.embed_tokens.forward(ids)
    }

    /// The final RMS norm.
    pub fn final_norm(&self, x: &Tensor) -> Tensor {
        self.norm.forward(x)
    }

    /// transformers' `hidden_states[k]` with `output_hidden_states=True` (B, L, hidden_size) for
    /// each `k` of `layers` (ascending, at most the layer count) of plain text: `input_ids` (B, L)
    /// and `attention_mask` (B, L) of ones and zeros (padding, either side) at positions 0‥L. The
    /// last layer's state is after the final norm when `final_norm` (transformers 5 ties it to
    /// `last_hidden_state`). `model` names the encoder in errors.
    pub fn text_states(
        &self,
        model: &str,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        layers: &[usize],
        final_norm: bool,
    ) -> Result<Vec<Tensor>, ModelError> {
        let (b, l) = input_ids.size2()?;
        if attention_mask.size() != [b, l] {
            return Err(ModelError::Input(format!(
                "{model} attention_mask must have the shape of input_ids {:?}, got {:?}",
                [b, l],
                attention_mask.size()
            )));
        }
        let count = self.shape.num_hidden_layers;
        if layers.windows(2).any(|w| w[1] <= w[0]) || layers.iter().any(|&k| k > count) {
            return Err(ModelError::Input(format!(
                "{model} hidden state layers {layers:?}: expected ascending indices up to the \
                 encoder's {count} layers"
            )));
        }
        let positions = text_positions(b, l, input_ids.device());
        let x = self.embed(input_ids);
        let section = [self.shape.head_dim / 2];
        let mut states = self.run_states(x, attention_mask, &positions, &section, layers)?;
        if final_norm && layers.last() == Some(&count) {
            let last = states.pop().expect("the last layer's state");
            states.push(self.final_norm(&last));
        }
        Ok(states)
    }

    /// cos and sin (B, 1, L, head_dim) of `positions` (3, B, L), computed in f32 as transformers
    /// does: each frequency rotates by the position row `rope` gives it.
    fn rotary(&self, positions: &Tensor, rope: Mrope<'_>) -> (Tensor, Tensor) {
        let dim = self.shape.head_dim;
        let device = positions.device();
        let exponents = Tensor::arange_start_step(0, dim, 2, (Kind::Float, device)) / dim as f64;
        let inv_freq = Tensor::pow_scalar(self.shape.rope_theta, &exponents).reciprocal();
        // (3, B, L, F): frequency f picks row rows[f].
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * inv_freq;
        let rows = Tensor::from_slice(&rope.rows(dim / 2)).to_device(device);
        let (_, b, l, f) = freqs.size4().expect("(3, B, L, F)");
        let half = freqs.gather(0, &rows.view([1, 1, 1, f]).expand([1, b, l, f], false), false);
        let angles = Tensor::cat(&[&half, &half], -1).squeeze_dim(0).unsqueeze(1);
        (angles.cos(), angles.sin())
    }

    /// The first `depth` layers on embeddings `x` (B, L, D) at `positions` (3, B, L), under a
    /// causal mask and `attention_mask` (B, L) (1 = token, 0 = padding); no final norm.
    pub fn run(
        &self,
        x: Tensor,
        attention_mask: &Tensor,
        positions: &Tensor,
        section: &[i64],
        depth: usize,
    ) -> Result<Tensor, tch::TchError> {
        let mut states = self.run_states(x, attention_mask, positions, section, &[depth])?;
        Ok(states.pop().expect("one state per depth"))
    }

    /// As [`Self::run`], the states after each of `depths` layers (ascending; 0 is the
    /// embeddings), up to the deepest one: transformers' `hidden_states[k]` below the last layer.
    pub fn run_states(
        &self,
        x: Tensor,
        attention_mask: &Tensor,
        positions: &Tensor,
        section: &[i64],
        depths: &[usize],
    ) -> Result<Vec<Tensor>, tch::TchError> {
        self.run_states_with(x, attention_mask, positions, Mrope::Chunked(section), depths, None)
    }

    /// As [`Self::run_states`] with the rotary layout `rope`; with `deepstack`, its features are
    /// added after the first layers (the states include them).
    pub fn run_states_with(
        &self,
        mut x: Tensor,
        attention_mask: &Tensor,
        positions: &Tensor,
        rope: Mrope<'_>,
        depths: &[usize],
        deepstack: Option<&Deepstack<'_>>,
    ) -> Result<Vec<Tensor>, tch::TchError> {
        let (b, l) = attention_mask.size2()?;
        let (cos, sin) = self.rotary(positions, rope);
        let (cos, sin) = (cos.to_kind(x.kind()), sin.to_kind(x.kind()));
        let causal = Tensor::ones([l, l], (Kind::Bool, x.device())).tril(0);
        let keys = attention_mask.to_kind(Kind::Bool).view([b, 1, 1, l]);
        let mask = causal.view([1, 1, l, l]).logical_and(&keys);
        let deepest = depths.iter().copied().max().unwrap_or(0);
        let mut states = vec![];
        for (done, layer) in self.layers[..deepest].iter().enumerate() {
            if depths.contains(&done) {
                states.push(x.shallow_clone());
            }
            x = self.layer(layer, &x, (&cos, &sin), &mask, None);
            if let Some(d) = deepstack {
                x = d.add_after(done, x);
            }
        }
        if depths.contains(&deepest) {
            states.push(x);
        }
        Ok(states)
    }

    /// One decoder layer on `x` (B, L, D) with rotary `(cos, sin)` of its positions and the
    /// boolean `mask` (B, 1, L, keys); with `cache`, the layer's keys and values of earlier
    /// tokens come first and this call's are appended to them.
    fn layer(
        &self,
        layer: &Layer,
        x: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        mask: &Tensor,
        cache: Option<&mut LayerCache>,
    ) -> Tensor {
        let (b, l, _) = x.size3().expect("(B, L, D)");
        let (heads, kv_heads) = (self.shape.num_attention_heads, self.shape.num_key_value_heads);
        let rotate = |t: &Tensor| {
            let half = t.size()[3] / 2;
            let rotated = Tensor::cat(&[-t.narrow(3, half, half), t.narrow(3, 0, half)], 3);
            t * cos + rotated * sin
        };
        let h = layer.input_layernorm.forward(x);
        let split = |t: Tensor, n: i64, norm: Option<&RmsNorm>| {
            let t = t.view([b, l, n, -1]);
            norm.map_or(t.shallow_clone(), |m| m.forward(&t)).transpose(1, 2)
        };
        let q = rotate(&split(layer.q_proj.forward(&h), heads, layer.q_norm.as_ref()));
        let k = rotate(&split(layer.k_proj.forward(&h), kv_heads, layer.k_norm.as_ref()));
        let v = split(layer.v_proj.forward(&h), kv_heads, None);
        let attn = match cache {
            // Decoding reads the cached keys and values of each group in place rather than
            // copying them per query head every step.
            Some(cache) => {
                let (k, v) = cache.append(k, v);
                grouped_attention(&q, &k, &v, Some(mask))
            }
            None => {
                let repeat = heads / kv_heads;
                let (k, v) = if repeat > 1 {
                    (
                        k.repeat_interleave_self_int(repeat, 1, None),
                        v.repeat_interleave_self_int(repeat, 1, None),
                    )
                } else {
                    (k, v)
                };
                attention(&q, &k, &v, Some(mask), false, None)
            }
        };
        let x = x + layer.o_proj.forward(&attn.transpose(1, 2).reshape([b, l, -1]));
        let h = layer.post_attention_layernorm.forward(&x);
        let gated = layer.gate_proj.forward(&h).silu() * layer.up_proj.forward(&h);
        &x + layer.down_proj.forward(&gated)
    }

    /// The final-normed states (B, L, D) of `x` (B, L, D), new tokens after those `cache` holds,
    /// at `positions` (3, B, L): each attends to the cached and new tokens up to itself that
    /// `keys` (B, cached + L; 1 = token, 0 = padding) keeps, and always to itself (so a padding
    /// row is never fully masked). The cache grows by the L tokens.
    pub fn run_cached(
        &self,
        x: Tensor,
        keys: &Tensor,
        positions: &Tensor,
        rope: Mrope<'_>,
        cache: &mut KvCache,
        deepstack: Option<&Deepstack<'_>>,
    ) -> Result<Tensor, tch::TchError> {
        let (b, l, _) = x.size3()?;
        let past = cache.len();
        let total = keys.size2()?.1;
        if total != past + l {
            return Err(tch::TchError::Shape(format!(
                "keys mask of {total} columns for {past} cached and {l} new tokens"
            )));
        }
        let device = x.device();
        let (cos, sin) = self.rotary(positions, rope);
        let (cos, sin) = (cos.to_kind(x.kind()), sin.to_kind(x.kind()));
        let query = Tensor::arange_start(past, past + l, (Kind::Int64, device)).view([l, 1]);
        let key = Tensor::arange(total, (Kind::Int64, device)).view([1, total]);
        let causal = key.le_tensor(&query).view([1, 1, l, total]);
        let kept = keys.to_kind(Kind::Bool).view([b, 1, 1, total]);
        let mask =
            causal.logical_and(&kept).logical_or(&key.eq_tensor(&query).view([1, 1, l, total]));
        if cache.layers.is_empty() {
            cache.layers = self.layers.iter().map(|_| LayerCache::default()).collect();
        }
        let mut x = x;
        for (done, (layer, slot)) in self.layers.iter().zip(&mut cache.layers).enumerate() {
            x = self.layer(layer, &x, (&cos, &sin), &mask, Some(slot));
            if let Some(d) = deepstack {
                x = d.add_after(done, x);
            }
        }
        Ok(self.final_norm(&x))
    }

    /// The token embedding table (vocab, D): the output projection of models that tie them.
    pub fn embedding_weight(&self) -> &Tensor {
        &self.embed_tokens.weight
    }
}

/// One layer's keys and values (B, kv_heads, T, head_dim) of the tokens seen so far.
#[derive(Default)]
struct LayerCache {
    kv: Option<(Tensor, Tensor)>,
}

impl LayerCache {
    /// The cached keys and values followed by `k` and `v`, kept for the next call.
    fn append(&mut self, k: Tensor, v: Tensor) -> (Tensor, Tensor) {
        let (k, v) = match self.kv.take() {
            Some((pk, pv)) => (Tensor::cat(&[pk, k], 2), Tensor::cat(&[pv, v], 2)),
            None => (k, v),
        };
        self.kv = Some((k.shallow_clone(), v.shallow_clone()));
        (k, v)
    }
}

/// Every layer's keys and values of the tokens a decoder has seen (greedy decoding).
#[derive(Default)]
pub struct KvCache {
    layers: Vec<LayerCache>,
}

impl KvCache {
    /// Tokens cached.
    pub fn len(&self) -> i64 {
        self.layers.first().and_then(|c| c.kv.as_ref()).map_or(0, |(k, _)| k.size()[2])
    }

    /// Whether no token is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps the rows `rows` (indices into the batch) only.
    pub fn keep_rows(&mut self, rows: &Tensor) {
        for layer in &mut self.layers {
            if let Some((k, v)) = layer.kv.take() {
                layer.kv = Some((k.index_select(0, rows), v.index_select(0, rows)));
            }
        }
    }
}
