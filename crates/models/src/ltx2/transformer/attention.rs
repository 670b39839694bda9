//! `LTX2Attention`: queries and keys RMS-normed across heads and turned by rotary tables before
//! the head split, an optional per-head sigmoid gate (LTX-2.3) before the output projection.

use tch::{Kind, Tensor};

use super::rope::Rope;
use crate::nn::{attention, project, Linear, RmsNorm, Scope};
use crate::sequence::Keys;

/// What an attention's keys are.
#[derive(Clone, Copy)]
pub enum Over<'k, 'a> {
    /// The text states (on every rank), with an additive key bias (B, 1, 1, L).
    Text(Option<&'k Tensor>),
    /// A token stream's: through Ulysses when a sequence-parallel group splits the tokens.
    Tokens(&'k Keys<'a>),
}

/// The query/key norms' epsilon (diffusers builds every `LTX2Attention` with its default).
const QK_EPS: f64 = 1e-6;

/// Shapes of one attention layer.
pub struct AttentionSpec {
    pub query_dim: i64,
    /// Width of the keys' and values' input (`query_dim` for self-attention).
    pub context_dim: i64,
    pub heads: i64,
    pub head_dim: i64,
    pub bias: bool,
    pub out_bias: bool,
    pub gated: bool,
}

/// One attention layer (`attn1`, `audio_to_video_attn`, …).
pub struct Ltx2Attention {
    pub to_q: Linear,
    pub to_k: Linear,
    pub to_v: Linear,
    /// `to_out.0`.
    pub to_out: Linear,
    pub norm_q: RmsNorm,
    pub norm_k: RmsNorm,
    /// One logit per head from the query input; the output of head h is scaled by
    /// `2·sigmoid(logit_h)`.
    pub to_gate_logits: Option<Linear>,
    pub heads: i64,
}

impl Ltx2Attention {
    pub fn new(s: &Scope<'_>, spec: &AttentionSpec) -> Self {
        let inner = spec.heads * spec.head_dim;
        let (to_q, to_k, to_v) = if spec.query_dim == spec.context_dim {
            let [q, k, v] = s.linears(
                spec.query_dim,
                [("to_q", inner), ("to_k", inner), ("to_v", inner)],
                spec.bias,
            );
            (q, k, v)
        } else {
            let q = (s / "to_q").linear(spec.query_dim, inner, spec.bias);
            let [k, v] = s.linears(spec.context_dim, [("to_k", inner), ("to_v", inner)], spec.bias);
            (q, k, v)
        };
        Self {
            to_q,
            to_k,
            to_v,
            to_out: (&(s / "to_out") / 0).linear(inner, spec.query_dim, spec.out_bias),
            norm_q: RmsNorm::new(&(s / "norm_q"), inner, QK_EPS),
            norm_k: RmsNorm::new(&(s / "norm_k"), inner, QK_EPS),
            to_gate_logits: spec
                .gated
                .then(|| (s / "to_gate_logits").linear(spec.query_dim, spec.heads, true)),
            heads: spec.heads,
        }
    }

    /// Attention of `x` (B, S, query_dim) to `context` (B, L, context_dim), itself when `None`,
    /// over the keys `over` says; the queries turn by `q_rope`, the keys by `k_rope` (or `q_rope`
    /// when `None`). With a sequence-parallel group, `x` and a token `context` are this rank's
    /// shares of their streams, as are their rotary tables.
    pub fn forward(
        &self,
        x: &Tensor,
        context: Option<&Tensor>,
        over: Over<'_, '_>,
        q_rope: Option<&Rope>,
        k_rope: Option<&Rope>,
    ) -> Tensor {
        let (b, s) = (x.size()[0], x.size()[1]);
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
        let mut q = self.norm_q.forward(&q).to_kind(x.kind());
        let mut k = self.norm_k.forward(&k).to_kind(x.kind());
        if let Some(rope) = q_rope {
            q = rope.apply(&q);
            k = k_rope.unwrap_or(rope).apply(&k);
        }
        let heads = |t: &Tensor| t.view([b, t.size()[1], self.heads, -1]);
        let (q, k, v) = (heads(&q), heads(&k), heads(&v));
        let out = match over {
            Over::Tokens(keys) => keys.attention(&q, &k, &v),
            Over::Text(bias) => {
                let t = |x: &Tensor| x.transpose(1, 2);
                attention(&t(&q), &t(&k), &t(&v), bias, false, None).transpose(1, 2)
            }
        };
        let out = match &self.to_gate_logits {
            Some(gate) => {
                let gates = gate.forward(x).sigmoid() * 2.0;
                let gates = gates.unsqueeze(-1).to_kind(out.kind());
                out * gates
            }
            None => out,
        };
        self.to_out.forward(&out.reshape([b, s, -1]))
    }
}

/// The blocks' `RMSNorm` (diffusers' own: statistics in f32, without a scale unless
/// `norm_elementwise_affine`).
pub struct BlockNorm {
    pub weight: Option<Tensor>,
    pub eps: f64,
}

impl BlockNorm {
    pub fn new(s: &Scope<'_>, dim: i64, affine: bool, eps: f64) -> Self {
        Self { weight: affine.then(|| s.var("weight", &[dim])), eps }
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        let variance = x.to_kind(Kind::Float).square().mean_dim(-1, true, Kind::Float);
        let normed = x * (variance + self.eps).rsqrt();
        match &self.weight {
            Some(w) if matches!(w.kind(), Kind::Half | Kind::BFloat16) => {
                normed.to_kind(w.kind()) * w
            }
            Some(w) => normed * w,
            None => normed.to_kind(x.kind()),
        }
    }
}
