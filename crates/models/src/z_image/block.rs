//! `ZImageTransformerBlock`: single-stream self-attention with per-head RMS-normed queries and
//! keys and 3-axis rotary positions, a SwiGLU feed-forward, sandwich RMS norms around both, and
//! (when modulated) adaLN scales and tanh gates from the timestep embedding.

use tch::Tensor;

use super::rope::rotate;
use crate::nn::{project, Linear, RmsNorm, Scope};
use crate::sequence::Keys;

/// The diffusers `Attention` of a block: bias-free projections, `norm_q` / `norm_k` per head.
pub struct SelfAttention {
    pub to_q: Linear,
    pub to_k: Linear,
    pub to_v: Linear,
    pub to_out: Linear,
    pub norm_q: Option<RmsNorm>,
    pub norm_k: Option<RmsNorm>,
    pub heads: i64,
}

/// diffusers builds the per-head norms with this epsilon whatever `norm_eps` is.
const QK_NORM_EPS: f64 = 1e-5;

impl SelfAttention {
    fn new(scope: &Scope<'_>, dim: i64, heads: i64, qk_norm: bool) -> Self {
        let head_dim = dim / heads;
        let norm =
            |name: &str| qk_norm.then(|| RmsNorm::new(&(scope / name), head_dim, QK_NORM_EPS));
        let [to_q, to_k, to_v] =
            scope.linears(dim, [("to_q", dim), ("to_k", dim), ("to_v", dim)], false);
        Self {
            to_q,
            to_k,
            to_v,
            to_out: (&(scope / "to_out") / 0).linear(dim, dim, false),
            norm_q: norm("norm_q"),
            norm_k: norm("norm_k"),
            heads,
        }
    }

    /// Attention over `x` (B, S, D) and its `keys` (this rank's share when they split it).
    fn forward(&self, x: &Tensor, rotations: &Tensor, keys: &Keys<'_>) -> Tensor {
        let (b, s) = (x.size()[0], x.size()[1]);
        let [q, k, v] = project(x, [&self.to_q, &self.to_k, &self.to_v]);
        let heads = |t: Tensor, norm: Option<&RmsNorm>| {
            let t = t.view([b, s, self.heads, -1]);
            let t = norm.map_or_else(|| t.shallow_clone(), |n| n.forward(&t));
            rotate(&t, rotations)
        };
        let q = heads(q, self.norm_q.as_ref());
        let k = heads(k, self.norm_k.as_ref());
        let v = v.view([b, s, self.heads, -1]);
        let out = keys.attention(&q, &k, &v);
        self.to_out.forward(&out.reshape([b, s, -1]))
    }
}

/// `FeedForward`: `w2(silu(w1 x) · w3 x)`, bias-free.
pub struct SwiGlu {
    pub w1: Linear,
    pub w2: Linear,
    pub w3: Linear,
}

impl SwiGlu {
    fn new(scope: &Scope<'_>, dim: i64, hidden: i64) -> Self {
        let [w1, w3] = scope.linears(dim, [("w1", hidden), ("w3", hidden)], false);
        Self { w1, w2: (scope / "w2").linear(hidden, dim, false), w3 }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let [gate, up] = project(x, [&self.w1, &self.w3]);
        self.w2.forward(&(gate.silu() * up))
    }
}

/// One block of the noise refiner (modulated), the context refiner (not) or the main stack.
pub struct ZImageBlock {
    pub attention: SelfAttention,
    pub feed_forward: SwiGlu,
    pub attention_norm1: RmsNorm,
    pub attention_norm2: RmsNorm,
    pub ffn_norm1: RmsNorm,
    pub ffn_norm2: RmsNorm,
    /// `adaLN_modulation.0`: the timestep embedding → (attention scale, gate, FFN scale, gate).
    pub adaln_modulation: Option<Linear>,
}

/// Sizes shared by every block of a model.
pub struct BlockDims {
    pub dim: i64,
    pub heads: i64,
    pub ffn_dim: i64,
    pub adaln_dim: i64,
    pub norm_eps: f64,
    pub qk_norm: bool,
}

impl ZImageBlock {
    pub fn new(scope: &Scope<'_>, d: &BlockDims, modulation: bool) -> Self {
        let norm = |name: &str| RmsNorm::new(&(scope / name), d.dim, d.norm_eps);
        Self {
            attention: SelfAttention::new(&(scope / "attention"), d.dim, d.heads, d.qk_norm),
            feed_forward: SwiGlu::new(&(scope / "feed_forward"), d.dim, d.ffn_dim),
            attention_norm1: norm("attention_norm1"),
            attention_norm2: norm("attention_norm2"),
            ffn_norm1: norm("ffn_norm1"),
            ffn_norm2: norm("ffn_norm2"),
            adaln_modulation: modulation
                .then(|| (&(scope / "adaLN_modulation") / 0).linear(d.adaln_dim, 4 * d.dim, true)),
        }
    }

    /// One block on `x` (B, S, D) attending over `keys`; `adaln` (B, adaln_dim) drives a
    /// modulated block. `x` and `rotations` are this rank's shares when `keys` split them.
    pub fn forward(
        &self,
        x: &Tensor,
        rotations: &Tensor,
        adaln: Option<&Tensor>,
        keys: &Keys<'_>,
    ) -> Tensor {
        let modulation = self
            .adaln_modulation
            .as_ref()
            .zip(adaln)
            .map(|(linear, emb)| linear.forward(emb).unsqueeze(1).chunk(4, 2));
        let scaled = |h: Tensor, i: usize| match &modulation {
            Some(m) => h * (&m[i] + 1.0),
            None => h,
        };
        let gated = |h: Tensor, i: usize| match &modulation {
            Some(m) => m[i].tanh() * h,
            None => h,
        };
        let attn =
            self.attention.forward(&scaled(self.attention_norm1.forward(x), 0), rotations, keys);
        let x = x + gated(self.attention_norm2.forward(&attn), 1);
        let ffn = self.feed_forward.forward(&scaled(self.ffn_norm1.forward(&x), 2));
        &x + gated(self.ffn_norm2.forward(&ffn), 3)
    }
}
