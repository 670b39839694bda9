//! FLUX.2's transformer blocks, without biases and with modulations shared by every block:
//! double-stream (`Flux2TransformerBlock`: image and text streams, joint attention, SwiGLU
//! feed-forwards) and single-stream (`Flux2SingleTransformerBlock`: one fused projection into
//! attention and a SwiGLU MLP in parallel, one fused output projection).

use tch::Tensor;

use crate::flux::block::{modulate, rotary_attention, Projections};
use crate::flux::rope::RotaryTables;
use crate::nn::{layer_norm, Linear, RmsNorm, Scope};
use crate::sequence::Keys;

/// `silu(first half) · second half` of the last dimension.
fn swiglu(x: &Tensor) -> Tensor {
    let parts = x.chunk(2, -1);
    parts[0].silu() * &parts[1]
}

/// `Flux2FeedForward`: `linear_in` to twice the hidden width, SwiGLU, `linear_out`.
pub struct SwiGluFeedForward {
    pub linear_in: Linear,
    pub linear_out: Linear,
}

impl SwiGluFeedForward {
    fn new(scope: &Scope<'_>, dim: i64, hidden: i64) -> Self {
        Self {
            linear_in: (scope / "linear_in").linear(dim, 2 * hidden, false),
            linear_out: (scope / "linear_out").linear(hidden, dim, false),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        self.linear_out.forward(&swiglu(&self.linear_in.forward(x)))
    }
}

/// One double-stream block; its modulations come from the transformer.
pub struct Flux2TransformerBlock {
    /// `attn.{to_q, to_k, to_v, norm_q, norm_k}`.
    pub image: Projections,
    /// `attn.{add_q_proj, add_k_proj, add_v_proj, norm_added_q, norm_added_k}`.
    pub text: Projections,
    pub to_out: Linear,
    pub to_add_out: Linear,
    pub ff: SwiGluFeedForward,
    pub ff_context: SwiGluFeedForward,
    pub heads: i64,
    pub eps: f64,
}

impl Flux2TransformerBlock {
    pub fn new(
        scope: &Scope<'_>,
        dim: i64,
        heads: i64,
        head_dim: i64,
        hidden: i64,
        eps: f64,
    ) -> Self {
        let attn = scope / "attn";
        let names = ["to_q", "to_k", "to_v", "norm_q", "norm_k"];
        let added = ["add_q_proj", "add_k_proj", "add_v_proj", "norm_added_q", "norm_added_k"];
        Self {
            image: Projections::new(&attn, names, dim, head_dim, false),
            text: Projections::new(&attn, added, dim, head_dim, false),
            to_out: (&(&attn / "to_out") / 0).linear(dim, dim, false),
            to_add_out: (&attn / "to_add_out").linear(dim, dim, false),
            ff: SwiGluFeedForward::new(&(scope / "ff"), dim, hidden),
            ff_context: SwiGluFeedForward::new(&(scope / "ff_context"), dim, hidden),
            heads,
            eps,
        }
    }

    /// Image tokens (B, S, D) and text tokens (B, L, D) with the image and text modulations
    /// (B, 6D) each → both updated; rotary tables cover `[text; image]` (this rank's shares when
    /// `keys` split them).
    pub fn forward(
        &self,
        image: &Tensor,
        text: &Tensor,
        (mod_image, mod_text): (&Tensor, &Tensor),
        rope: &RotaryTables,
        keys: &Keys<'_>,
    ) -> (Tensor, Tensor) {
        let (m, c) = (mod_image.chunk(6, 1), mod_text.chunk(6, 1));
        let norm = |x: &Tensor, shift: &Tensor, scale: &Tensor| {
            modulate(&layer_norm(x, self.eps), shift, scale)
        };
        let [iq, ik, iv] = self.image.heads(&norm(image, &m[0], &m[1]), self.heads);
        let [tq, tk, tv] = self.text.heads(&norm(text, &c[0], &c[1]), self.heads);
        let out = rotary_attention(
            &Tensor::cat(&[tq, iq], 1),
            &Tensor::cat(&[tk, ik], 1),
            &Tensor::cat(&[tv, iv], 1),
            rope,
            keys,
        );
        let (l, n) = (text.size()[1], out.size()[1]);
        let image = image + m[2].unsqueeze(1) * self.to_out.forward(&out.narrow(1, l, n - l));
        let image = &image + m[5].unsqueeze(1) * self.ff.forward(&norm(&image, &m[3], &m[4]));
        let text = text + c[2].unsqueeze(1) * self.to_add_out.forward(&out.narrow(1, 0, l));
        let text = &text + c[5].unsqueeze(1) * self.ff_context.forward(&norm(&text, &c[3], &c[4]));
        (image, text)
    }
}

/// One single-stream block over the joint `[text; image]` tokens.
pub struct Flux2SingleTransformerBlock {
    /// `attn.to_qkv_mlp_proj`: queries, keys, values and the MLP's SwiGLU input in one.
    pub to_qkv_mlp_proj: Linear,
    pub norm_q: RmsNorm,
    pub norm_k: RmsNorm,
    /// `attn.to_out`: `[attention; MLP]` back to the stream width.
    pub to_out: Linear,
    pub heads: i64,
    pub eps: f64,
}

impl Flux2SingleTransformerBlock {
    pub fn new(
        scope: &Scope<'_>,
        dim: i64,
        heads: i64,
        head_dim: i64,
        hidden: i64,
        eps: f64,
    ) -> Self {
        let attn = scope / "attn";
        Self {
            to_qkv_mlp_proj: (&attn / "to_qkv_mlp_proj").linear(dim, 3 * dim + 2 * hidden, false),
            norm_q: RmsNorm::new(&(&attn / "norm_q"), head_dim, eps),
            norm_k: RmsNorm::new(&(&attn / "norm_k"), head_dim, eps),
            to_out: (&attn / "to_out").linear(dim + hidden, dim, false),
            heads,
            eps,
        }
    }

    /// Joint tokens (B, L + S, D) with the single-stream modulation (B, 3D) → updated (this
    /// rank's shares of text and image when `keys` split them).
    pub fn forward(
        &self,
        x: &Tensor,
        modulation: &Tensor,
        rope: &RotaryTables,
        keys: &Keys<'_>,
    ) -> Tensor {
        let m = modulation.chunk(3, 1);
        let normed = modulate(&layer_norm(x, self.eps), &m[0], &m[1]);
        let fused = self.to_qkv_mlp_proj.forward(&normed);
        let (b, s, dim) = (x.size()[0], x.size()[1], x.size()[2]);
        let qkv = fused.narrow(2, 0, 3 * dim);
        let mlp = fused.narrow(2, 3 * dim, fused.size()[2] - 3 * dim);
        let heads = |i: i64| qkv.narrow(2, i * dim, dim).view([b, s, self.heads, -1]);
        let (q, k) = (self.norm_q.forward(&heads(0)), self.norm_k.forward(&heads(1)));
        let attn = rotary_attention(&q, &k, &heads(2), rope, keys);
        x + m[2].unsqueeze(1) * self.to_out.forward(&Tensor::cat(&[attn, swiglu(&mlp)], 2))
    }
}
