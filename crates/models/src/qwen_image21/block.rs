//! Qwen-Image 2.1's single-stream block (`QwenImage21TransformerBlock`): scale-only AdaLN with
//! tanh gates from the transformer's shared modulation, block-causal attention with per-head RMS
//! norms and 3-axis rotary positions, a SwiGLU feed-forward; no biases anywhere.

use tch::Tensor;

use crate::nn::{attention, layer_norm, project, Linear, RmsNorm, Scope};
use crate::qwen_image::rope::apply_rotary;

/// What every block of one forward shares: rotary angles, where the target starts, the masks.
pub struct Context {
    /// (S, head_dim / 2).
    pub angles: Tensor,
    /// Tokens before the target's.
    pub prefix: i64,
    /// The prefix's block-causal mask (B or 1, 1, P, P), padded text keys dropped.
    pub prefix_mask: Tensor,
    /// Valid keys (B, 1, 1, S) for the target's queries; `None` when nothing is padded.
    pub target_mask: Option<Tensor>,
    /// Text and condition tokens take the modulation's last row (`t = 0`, `causal_condition`).
    pub causal_condition: bool,
}

impl Context {
    /// The same context, sharing storage (each checkpointed block owns one for its recompute).
    pub fn shallow_clone(&self) -> Self {
        Self {
            angles: self.angles.shallow_clone(),
            prefix: self.prefix,
            prefix_mask: self.prefix_mask.shallow_clone(),
            target_mask: self.target_mask.as_ref().map(Tensor::shallow_clone),
            causal_condition: self.causal_condition,
        }
    }

    /// Per-token parameters (B, S, D) from rows (B [+ 1], D): the target's tokens read their
    /// sample's row; with `causal_condition` the others read the trailing `t = 0` row.
    pub fn select(&self, params: &Tensor, len: i64) -> Tensor {
        if !self.causal_condition {
            return params.unsqueeze(1);
        }
        let (rows, dim) = (params.size()[0], params.size()[1]);
        let b = rows - 1;
        let zero = params.narrow(0, b, 1).unsqueeze(0).expand([b, self.prefix, dim], false);
        let real = params.narrow(0, 0, b).unsqueeze(1).expand([b, len - self.prefix, dim], false);
        Tensor::cat(&[zero, real], 1)
    }
}

/// `QwenImage21SwiGLUFeedForward`: `out(silu(gate_layer(x)) · proj(x))`.
pub struct SwiGlu {
    pub proj: Linear,
    pub gate_layer: Linear,
    pub out: Linear,
}

/// One block; its modulation comes from the transformer.
pub struct QwenImage21TransformerBlock {
    pub to_q: Linear,
    pub to_k: Linear,
    pub to_v: Linear,
    pub norm_q: RmsNorm,
    pub norm_k: RmsNorm,
    /// `attn.to_out.0`.
    pub to_out: Linear,
    pub img_mlp: SwiGlu,
    pub heads: i64,
    pub eps: f64,
}

impl QwenImage21TransformerBlock {
    pub fn new(
        scope: &Scope<'_>,
        dim: i64,
        heads: i64,
        head_dim: i64,
        hidden: i64,
        eps: f64,
    ) -> Self {
        let attn = scope / "attn";
        let mlp = scope / "img_mlp";
        let inner = heads * head_dim;
        let [to_q, to_k, to_v] =
            attn.linears(dim, [("to_q", inner), ("to_k", inner), ("to_v", inner)], false);
        let [proj, gate_layer] =
            mlp.linears(dim, [("proj", hidden), ("gate_layer", hidden)], false);
        Self {
            to_q,
            to_k,
            to_v,
            norm_q: RmsNorm::new(&(&attn / "norm_q"), head_dim, eps),
            norm_k: RmsNorm::new(&(&attn / "norm_k"), head_dim, eps),
            to_out: (&(&attn / "to_out") / 0).linear(inner, dim, false),
            img_mlp: SwiGlu { proj, gate_layer, out: (&mlp / "out").linear(hidden, dim, false) },
            heads,
            eps,
        }
    }

    /// Joint tokens (B, S, D) with the shared modulation rows (B [+ 1], 4D) → updated.
    pub fn forward(&self, x: &Tensor, modulation: &Tensor, ctx: &Context) -> Tensor {
        let s = x.size()[1];
        let m: Vec<Tensor> = modulation.chunk(4, 1).iter().map(|p| ctx.select(p, s)).collect();
        let normed = layer_norm(x, self.eps) * (&m[0] + 1.0);
        let x = x + m[1].tanh() * self.attention(&normed, ctx);
        let normed = layer_norm(&x, self.eps) * (&m[2] + 1.0);
        let mlp = &self.img_mlp;
        let [up, gate] = project(&normed, [&mlp.proj, &mlp.gate_layer]);
        let ff = mlp.out.forward(&(gate.silu() * up));
        &x + m[3].tanh() * ff
    }

    /// Block-causal attention: the prefix's queries under its mask, the target's over every key.
    fn attention(&self, x: &Tensor, ctx: &Context) -> Tensor {
        let (b, s) = (x.size()[0], x.size()[1]);
        let [q, k, v] = project(x, [&self.to_q, &self.to_k, &self.to_v]);
        let heads = |t: Tensor| t.view([b, s, self.heads, -1]);
        let q = apply_rotary(&self.norm_q.forward(&heads(q)), &ctx.angles).transpose(1, 2);
        let k = apply_rotary(&self.norm_k.forward(&heads(k)), &ctx.angles).transpose(1, 2);
        let v = heads(v).transpose(1, 2);
        let p = ctx.prefix;
        let prefix = attention(
            &q.narrow(2, 0, p),
            &k.narrow(2, 0, p),
            &v.narrow(2, 0, p),
            Some(&ctx.prefix_mask),
            false,
            None,
        );
        let target =
            attention(&q.narrow(2, p, s - p), &k, &v, ctx.target_mask.as_ref(), false, None);
        let out = Tensor::cat(&[prefix, target], 2).transpose(1, 2).reshape([b, s, -1]);
        self.to_out.forward(&out)
    }
}
