//! `JointTransformerBlock`: AdaLN-Zero modulated joint attention and feed-forward on the image
//! and context streams; SD3.5 blocks may add a second, image-only attention (`attn2`).

use tch::Tensor;

use super::attention::Attention;
use crate::nn::{layer_norm, FeedForward, Linear, Scope};
use crate::sequence::Keys;

const NORM_EPS: f64 = 1e-6;

/// `x·(1 + scale) + shift` with per-sample (B, D) modulation on (B, N, D) tokens.
fn modulate(x: &Tensor, shift: &Tensor, scale: &Tensor) -> Tensor {
    x * (scale.unsqueeze(1) + 1.0) + shift.unsqueeze(1)
}

/// The `linear` of an AdaLN layer applied to SiLU(temb), split into `parts` chunks.
fn ada_chunks(linear: &Linear, temb: &Tensor, parts: i64) -> Vec<Tensor> {
    linear.forward(&temb.silu()).chunk(parts, 1)
}

/// How the context stream is normalised: AdaLN-Zero (continues) or continuous AdaLN (last block).
pub enum ContextNorm {
    Zero(Linear),
    PreOnly(Linear),
}

pub struct JointTransformerBlock {
    /// AdaLN-Zero of the image stream: 6 chunks, or 9 with dual attention (SD35AdaLayerNormZeroX).
    pub norm1: Linear,
    pub norm1_context: ContextNorm,
    pub attn: Attention,
    pub attn2: Option<Attention>,
    pub ff: FeedForward,
    pub ff_context: Option<FeedForward>,
}

impl JointTransformerBlock {
    pub fn new(
        scope: &Scope<'_>,
        dim: i64,
        heads: i64,
        head_dim: i64,
        pre_only: bool,
        qk_norm: bool,
        dual: bool,
    ) -> Self {
        let chunks = if dual { 9 } else { 6 };
        let context_linear =
            |n: i64| (&(scope / "norm1_context") / "linear").linear(dim, n * dim, true);
        Self {
            norm1: (&(scope / "norm1") / "linear").linear(dim, chunks * dim, true),
            norm1_context: if pre_only {
                ContextNorm::PreOnly(context_linear(2))
            } else {
                ContextNorm::Zero(context_linear(6))
            },
            attn: Attention::new(&(scope / "attn"), dim, heads, head_dim, qk_norm, true, !pre_only),
            attn2: dual.then(|| {
                Attention::new(&(scope / "attn2"), dim, heads, head_dim, qk_norm, false, false)
            }),
            ff: FeedForward::new(&(scope / "ff"), dim),
            ff_context: (!pre_only).then(|| FeedForward::new(&(scope / "ff_context"), dim)),
        }
    }

    /// One block: returns the new image tokens and (unless last) the new context tokens. `joint`
    /// and `image` are the keys of the joint and the image-only attention (the tokens are this
    /// rank's shares when they split them).
    pub fn forward(
        &self,
        x: &Tensor,
        c: &Tensor,
        temb: &Tensor,
        (joint, image): (&Keys<'_>, &Keys<'_>),
    ) -> (Tensor, Option<Tensor>) {
        let m = ada_chunks(&self.norm1, temb, if self.attn2.is_some() { 9 } else { 6 });
        let normed = layer_norm(x, NORM_EPS);
        let x_in = modulate(&normed, &m[0], &m[1]);
        let (c_in, c_mod) = match &self.norm1_context {
            ContextNorm::Zero(linear) => {
                let cm = ada_chunks(linear, temb, 6);
                (modulate(&layer_norm(c, NORM_EPS), &cm[0], &cm[1]), Some(cm))
            }
            ContextNorm::PreOnly(linear) => {
                // AdaLayerNormContinuous: chunks are (scale, shift).
                let cm = ada_chunks(linear, temb, 2);
                (modulate(&layer_norm(c, NORM_EPS), &cm[1], &cm[0]), None)
            }
        };
        let (attn_out, context_attn) = self.attn.forward_joint(&x_in, &c_in, joint);
        let mut x = x + m[2].unsqueeze(1) * attn_out;
        if let Some(attn2) = &self.attn2 {
            let x2_in = modulate(&normed, &m[6], &m[7]);
            x = &x + m[8].unsqueeze(1) * attn2.forward(&x2_in, image);
        }
        let ff_in = modulate(&layer_norm(&x, NORM_EPS), &m[3], &m[4]);
        let x = &x + m[5].unsqueeze(1) * self.ff.forward(&ff_in);
        let c = match (c_mod, context_attn, &self.ff_context) {
            (Some(cm), Some(context_attn), Some(ff_context)) => {
                let c = c + cm[2].unsqueeze(1) * context_attn;
                let ff_in = modulate(&layer_norm(&c, NORM_EPS), &cm[3], &cm[4]);
                Some(&c + cm[5].unsqueeze(1) * ff_context.forward(&ff_in))
            }
            _ => None,
        };
        (x, c)
    }
}
