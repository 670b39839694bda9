//! Joint attention (`JointAttnProcessor2_0`): image and text tokens attend together, each with
//! its own projections; and the plain self-attention of SD3.5's second (image-only) attention.

use tch::Tensor;

use crate::nn::{project, Linear, RmsNorm, Scope};
use crate::sequence::Keys;

/// q/k RMS-normalisation per head (SD3.5 `qk_norm: rms_norm`).
pub struct QkNorm {
    pub q: RmsNorm,
    pub k: RmsNorm,
}

/// `Attention` with optional added (context) projections.
pub struct Attention {
    pub to_q: Linear,
    pub to_k: Linear,
    pub to_v: Linear,
    pub to_out: Linear,
    pub norm: Option<QkNorm>,
    pub added: Option<AddedProjections>,
    pub heads: i64,
}

/// The context stream's projections; `to_add_out` is absent in the last (context-pre-only) block.
pub struct AddedProjections {
    pub add_q_proj: Linear,
    pub add_k_proj: Linear,
    pub add_v_proj: Linear,
    pub to_add_out: Option<Linear>,
    pub norm: Option<QkNorm>,
}

const QK_EPS: f64 = 1e-6;

impl Attention {
    /// `joint`: with context projections; `context_out`: whether the context stream continues.
    pub fn new(
        scope: &Scope<'_>,
        dim: i64,
        heads: i64,
        head_dim: i64,
        qk_norm: bool,
        joint: bool,
        context_out: bool,
    ) -> Self {
        let norm_pair = |q: &str, k: &str| {
            qk_norm.then(|| QkNorm {
                q: RmsNorm::new(&(scope / q), head_dim, QK_EPS),
                k: RmsNorm::new(&(scope / k), head_dim, QK_EPS),
            })
        };
        let inner = heads * head_dim;
        let [to_q, to_k, to_v] =
            scope.linears(dim, [("to_q", inner), ("to_k", inner), ("to_v", inner)], true);
        Self {
            to_q,
            to_k,
            to_v,
            to_out: (&(scope / "to_out") / 0).linear(inner, dim, true),
            norm: norm_pair("norm_q", "norm_k"),
            added: joint.then(|| {
                let names = [("add_q_proj", inner), ("add_k_proj", inner), ("add_v_proj", inner)];
                let [add_q_proj, add_k_proj, add_v_proj] = scope.linears(dim, names, true);
                AddedProjections {
                    add_q_proj,
                    add_k_proj,
                    add_v_proj,
                    to_add_out: context_out
                        .then(|| (scope / "to_add_out").linear(inner, dim, true)),
                    norm: norm_pair("norm_added_q", "norm_added_k"),
                }
            }),
            heads,
        }
    }

    /// Projected (B, N, inner) → (B, heads, N, head_dim), normalised if configured.
    fn heads_of(&self, projected: Tensor, norm: Option<&RmsNorm>) -> Tensor {
        let (b, n) = (projected.size()[0], projected.size()[1]);
        let t = projected.view([b, n, self.heads, -1]).transpose(1, 2);
        match norm {
            Some(norm) => norm.forward(&t),
            None => t,
        }
    }

    /// Self-attention over `x` alone (this rank's share of the tokens `keys` split).
    pub fn forward(&self, x: &Tensor, keys: &Keys<'_>) -> Tensor {
        let (q, k, v) = self.qkv(x);
        let out = attend(&q, &k, &v, keys);
        self.to_out.forward(&out)
    }

    fn qkv(&self, x: &Tensor) -> (Tensor, Tensor, Tensor) {
        let norm = self.norm.as_ref();
        let [q, k, v] = project(x, [&self.to_q, &self.to_k, &self.to_v]);
        (
            self.heads_of(q, norm.map(|n| &n.q)),
            self.heads_of(k, norm.map(|n| &n.k)),
            self.heads_of(v, None),
        )
    }

    /// Joint attention: image tokens `x` first, then context tokens `c` (this rank's shares of
    /// both when `keys` split them). Returns the image output and (unless context-pre-only) the
    /// context output.
    pub fn forward_joint(
        &self,
        x: &Tensor,
        c: &Tensor,
        keys: &Keys<'_>,
    ) -> (Tensor, Option<Tensor>) {
        let added = self.added.as_ref().expect("joint attention has context projections");
        let (q, k, v) = self.qkv(x);
        let norm = added.norm.as_ref();
        let [cq, ck, cv] = project(c, [&added.add_q_proj, &added.add_k_proj, &added.add_v_proj]);
        let cq = self.heads_of(cq, norm.map(|n| &n.q));
        let ck = self.heads_of(ck, norm.map(|n| &n.k));
        let cv = self.heads_of(cv, None);
        let cat = |a: Tensor, b: Tensor| Tensor::cat(&[a, b], 2);
        let out = attend(&cat(q, cq), &cat(k, ck), &cat(v, cv), keys);
        let n = x.size()[1];
        let total = out.size()[1];
        let image = self.to_out.forward(&out.narrow(1, 0, n));
        let context =
            added.to_add_out.as_ref().map(|proj| proj.forward(&out.narrow(1, n, total - n)));
        (image, context)
    }
}

/// Scaled dot-product attention (fused kernels on GPU, with backward) over `keys`;
/// (B, H, N, d) → (B, N, H·d).
fn attend(q: &Tensor, k: &Tensor, v: &Tensor, keys: &Keys<'_>) -> Tensor {
    let t = |x: &Tensor| x.transpose(1, 2);
    let out = keys.attention(&t(q), &t(k), &t(v));
    let (b, n, h, d) = out.size4().expect("4-d attention output");
    out.reshape([b, n, h * d])
}
