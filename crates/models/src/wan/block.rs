//! `WanTransformerBlock`: self-attention over the video tokens (queries and keys RMS-normed across
//! heads, 3-axis rotary positions), cross-attention to the text, a GELU feed-forward; the
//! timestep drives shift, scale and gate of self-attention and feed-forward through the block's
//! `scale_shift_table`.

use tch::{Kind, Tensor};

use super::rope::rotate;
use crate::nn::{layer_norm, project, FeedForward, LayerNorm, Linear, RmsNorm, Scope};
use crate::sequence::Keys;

/// `WanAttention` without the image branch: biased projections, `norm_q` / `norm_k` over the
/// full width (all heads at once).
pub struct WanAttention {
    pub to_q: Linear,
    pub to_k: Linear,
    pub to_v: Linear,
    pub to_out: Linear,
    pub norm_q: RmsNorm,
    pub norm_k: RmsNorm,
    pub heads: i64,
}

impl WanAttention {
    fn new(s: &Scope<'_>, dim: i64, heads: i64, eps: f64) -> Self {
        let [to_q, to_k, to_v] =
            s.linears(dim, [("to_q", dim), ("to_k", dim), ("to_v", dim)], true);
        Self {
            to_q,
            to_k,
            to_v,
            to_out: (&(s / "to_out") / 0).linear(dim, dim, true),
            norm_q: RmsNorm::new(&(s / "norm_q"), dim, eps),
            norm_k: RmsNorm::new(&(s / "norm_k"), dim, eps),
            heads,
        }
    }

    /// Attention of `x` (B, S, D) to `context` (B, L, D) (itself when `None`) over `keys`, with
    /// rotary positions (cos, sin) on queries and keys for self-attention. `x` is this rank's
    /// share of the sequence when `keys` split it (self-attention only).
    fn forward(
        &self,
        x: &Tensor,
        context: Option<&Tensor>,
        rope: Option<(&Tensor, &Tensor)>,
        keys: &Keys<'_>,
    ) -> Tensor {
        let (b, s) = (x.size()[0], x.size()[1]);
        // Self-attention projects x once; cross-attention projects keys and values of the context.
        let (q, k, v) = match context {
            None => {
                let [q, k, v] = project(x, [&self.to_q, &self.to_k, &self.to_v]);
                (q, k, v)
            }
            Some(context) => {
                let [k, v] = project(context, [&self.to_k, &self.to_v]);
                (self.to_q.forward(x), k, v)
            }
        };
        let split = |t: Tensor| {
            let len = t.size()[1];
            t.view([b, len, self.heads, -1])
        };
        let mut q = split(self.norm_q.forward(&q).to_kind(x.kind()));
        let mut k = split(self.norm_k.forward(&k).to_kind(x.kind()));
        let v = split(v);
        if let Some((cos, sin)) = rope {
            q = rotate(&q, cos, sin);
            k = rotate(&k, cos, sin);
        }
        let out = keys.attention(&q, &k, &v);
        self.to_out.forward(&out.reshape([b, s, -1]))
    }
}

/// One transformer block (`blocks.{i}`).
pub struct WanBlock {
    pub attn1: WanAttention,
    pub attn2: WanAttention,
    /// `norm2`: affine LayerNorm before cross-attention (with `cross_attn_norm`).
    pub norm2: Option<LayerNorm>,
    pub ffn: FeedForward,
    /// (1, 6, D): added to the timestep projection, then split into shift, scale, gate of
    /// self-attention and of the feed-forward.
    pub scale_shift_table: Tensor,
    eps: f64,
}

impl WanBlock {
    /// The block below `s` for width `dim`.
    pub fn new(
        s: &Scope<'_>,
        dim: i64,
        ffn_dim: i64,
        heads: i64,
        cross_attn_norm: bool,
        eps: f64,
    ) -> Self {
        Self {
            attn1: WanAttention::new(&(s / "attn1"), dim, heads, eps),
            attn2: WanAttention::new(&(s / "attn2"), dim, heads, eps),
            norm2: cross_attn_norm.then(|| LayerNorm::new(&(s / "norm2"), dim, eps)),
            ffn: FeedForward::with_hidden(&(s / "ffn"), dim, ffn_dim),
            scale_shift_table: s.var("scale_shift_table", &[1, 6, dim]),
            eps,
        }
    }

    /// `x` (B, S, D); `modulation` (B, S or 1, 6, D) the timestep projection (f32), one row per
    /// token for per-token timesteps; `text` (B, L, D); `rope` the rotary (cos, sin); `keys`
    /// self-attention's. `x`, per-token modulations and `rope` are this rank's share of the
    /// tokens when `keys` split them.
    pub fn forward(
        &self,
        x: &Tensor,
        modulation: &Tensor,
        text: &Tensor,
        rope: (&Tensor, &Tensor),
        keys: &Keys<'_>,
    ) -> Tensor {
        let kind = x.kind();
        let table = self.scale_shift_table.to_kind(Kind::Float).unsqueeze(0);
        let m: Vec<Tensor> =
            (table + modulation).chunk(6, 2).into_iter().map(|t| t.squeeze_dim(2)).collect();
        let (shift, scale, gate, c_shift, c_scale, c_gate) =
            (&m[0], &m[1], &m[2], &m[3], &m[4], &m[5]);
        let xf = x.to_kind(Kind::Float);
        let normed = (layer_norm(&xf, self.eps) * (scale + 1.0) + shift).to_kind(kind);
        let attn = self.attn1.forward(&normed, None, Some(rope), keys);
        let x = (xf + attn * gate).to_kind(kind);
        let normed = match &self.norm2 {
            Some(norm) => {
                let (w, b) = (norm.weight.to_kind(Kind::Float), norm.bias.to_kind(Kind::Float));
                let dim = w.size()[0];
                x.to_kind(Kind::Float)
                    .layer_norm([dim], Some(&w), Some(&b), norm.eps, true)
                    .to_kind(kind)
            }
            None => x.shallow_clone(),
        };
        let x = &x + self.attn2.forward(&normed, Some(text), None, &Keys::default());
        let xf = x.to_kind(Kind::Float);
        let normed = (layer_norm(&xf, self.eps) * (c_scale + 1.0) + c_shift).to_kind(kind);
        let ff = self.ffn.forward(&normed);
        (xf + ff.to_kind(Kind::Float) * c_gate).to_kind(kind)
    }
}
