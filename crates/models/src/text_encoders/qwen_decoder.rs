//! The decoder stack shared by the Qwen language models (Qwen2.5-VL's, Qwen3): pre-norm layers
//! with grouped-query attention under a causal and padding mask, rotary positions (multimodal
//! sections, or one section for plain text) and a SwiGLU MLP. Qwen3 adds per-head RMS norms on
//! queries and keys, drops the q/k/v biases and may set the head width explicitly.

use tch::{Kind, Tensor};

use crate::nn::{attention, Embedding, Linear, RmsNorm, Scope};

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

    /// cos and sin (B, 1, L, head_dim) of `positions` (3, B, L), computed in f32 as transformers
    /// does: frequency group `i` of `section` rotates by position row `i`.
    fn rotary(&self, positions: &Tensor, section: &[i64]) -> (Tensor, Tensor) {
        let dim = self.shape.head_dim;
        let device = positions.device();
        let exponents = Tensor::arange_start_step(0, dim, 2, (Kind::Float, device)) / dim as f64;
        let inv_freq = Tensor::pow_scalar(self.shape.rope_theta, &exponents).reciprocal();
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * inv_freq;
        let mut start = 0;
        let groups: Vec<Tensor> = section
            .iter()
            .enumerate()
            .map(|(row, &n)| {
                let group = freqs.get(row as i64).narrow(-1, start, n);
                start += n;
                group
            })
            .collect();
        let half = Tensor::cat(&groups, -1);
        let angles = Tensor::cat(&[&half, &half], -1).unsqueeze(1);
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
        mut x: Tensor,
        attention_mask: &Tensor,
        positions: &Tensor,
        section: &[i64],
        depths: &[usize],
    ) -> Result<Vec<Tensor>, tch::TchError> {
        let (b, l) = attention_mask.size2()?;
        let device = x.device();
        let (cos, sin) = self.rotary(positions, section);
        let (cos, sin) = (cos.to_kind(x.kind()), sin.to_kind(x.kind()));
        let causal = Tensor::ones([l, l], (Kind::Bool, device)).tril(0);
        let keys = attention_mask.to_kind(Kind::Bool).view([b, 1, 1, l]);
        let mask = causal.view([1, 1, l, l]).logical_and(&keys);
        let (heads, kv_heads) = (self.shape.num_attention_heads, self.shape.num_key_value_heads);
        let rotate = |t: &Tensor| {
            let half = t.size()[3] / 2;
            let rotated = Tensor::cat(&[-t.narrow(3, half, half), t.narrow(3, 0, half)], 3);
            t * &cos + rotated * &sin
        };
        let deepest = depths.iter().copied().max().unwrap_or(0);
        let mut states = vec![];
        for (done, layer) in self.layers[..deepest].iter().enumerate() {
            if depths.contains(&done) {
                states.push(x.shallow_clone());
            }
            let h = layer.input_layernorm.forward(&x);
            let split = |t: Tensor, n: i64, norm: Option<&RmsNorm>| {
                let t = t.view([b, l, n, -1]);
                norm.map_or(t.shallow_clone(), |m| m.forward(&t)).transpose(1, 2)
            };
            let q = rotate(&split(layer.q_proj.forward(&h), heads, layer.q_norm.as_ref()));
            let k = rotate(&split(layer.k_proj.forward(&h), kv_heads, layer.k_norm.as_ref()));
            let v = split(layer.v_proj.forward(&h), kv_heads, None);
            let repeat = heads / kv_heads;
            let (k, v) = if repeat > 1 {
                (
                    k.repeat_interleave_self_int(repeat, 1, None),
                    v.repeat_interleave_self_int(repeat, 1, None),
                )
            } else {
                (k, v)
            };
            let attn = attention(&q, &k, &v, Some(&mask), false, None);
            x = &x + layer.o_proj.forward(&attn.transpose(1, 2).reshape([b, l, -1]));
            let h = layer.post_attention_layernorm.forward(&x);
            let gated = layer.gate_proj.forward(&h).silu() * layer.up_proj.forward(&h);
            x = &x + layer.down_proj.forward(&gated);
        }
        if depths.contains(&deepest) {
            states.push(x);
        }
        Ok(states)
    }
}
