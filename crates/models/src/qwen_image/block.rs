//! `QwenImageTransformerBlock`: two streams (image, text), each with its own AdaLN modulation,
//! joint attention over `[text; image]` with RMS-normed queries and keys and 3-axis rotary
//! positions, and a GELU(tanh) feed-forward.

use tch::Tensor;

use super::rope::{apply_rotary, RotaryAngles};
use crate::nn::{layer_norm, project, FeedForward, Linear, RmsNorm, Scope};
use crate::sequence::Keys;

const EPS: f64 = 1e-6;

/// The block's `attn`: image projections `to_*`, text projections `add_*`, per-head RMS norms.
pub struct JointAttention {
    pub to_q: Linear,
    pub to_k: Linear,
    pub to_v: Linear,
    pub to_out: Linear,
    pub add_q_proj: Linear,
    pub add_k_proj: Linear,
    pub add_v_proj: Linear,
    pub to_add_out: Linear,
    pub norm_q: RmsNorm,
    pub norm_k: RmsNorm,
    pub norm_added_q: RmsNorm,
    pub norm_added_k: RmsNorm,
    pub heads: i64,
}

impl JointAttention {
    pub fn new(scope: &Scope<'_>, dim: i64, heads: i64, head_dim: i64) -> Self {
        let inner = heads * head_dim;
        let linear =
            |name: &str, input: i64, output: i64| (scope / name).linear(input, output, true);
        let norm = |name: &str| RmsNorm::new(&(scope / name), head_dim, EPS);
        let [to_q, to_k, to_v] =
            scope.linears(dim, [("to_q", inner), ("to_k", inner), ("to_v", inner)], true);
        let added = [("add_q_proj", inner), ("add_k_proj", inner), ("add_v_proj", inner)];
        let [add_q_proj, add_k_proj, add_v_proj] = scope.linears(dim, added, true);
        Self {
            to_q,
            to_k,
            to_v,
            to_out: (&(scope / "to_out") / 0).linear(inner, dim, true),
            add_q_proj,
            add_k_proj,
            add_v_proj,
            to_add_out: linear("to_add_out", inner, dim),
            norm_q: norm("norm_q"),
            norm_k: norm("norm_k"),
            norm_added_q: norm("norm_added_q"),
            norm_added_k: norm("norm_added_k"),
            heads,
        }
    }

    /// Projected (B, S, inner) → (B, S, H, d), normed and rotated where given.
    fn heads_of(
        &self,
        projected: Tensor,
        norm: Option<&RmsNorm>,
        angles: Option<&Tensor>,
    ) -> Tensor {
        let (b, s) = (projected.size()[0], projected.size()[1]);
        let t = projected.view([b, s, self.heads, -1]);
        let t = norm.map_or(t.shallow_clone(), |n| n.forward(&t));
        angles.map_or(t.shallow_clone(), |a| apply_rotary(&t, a))
    }

    /// Joint attention over `keys` (`[text; image]`, padded text masked): returns the image and
    /// text outputs. Both streams are this rank's shares when `keys` split them.
    pub fn forward(
        &self,
        image: &Tensor,
        text: &Tensor,
        rope: &RotaryAngles,
        keys: &Keys<'_>,
    ) -> (Tensor, Tensor) {
        let (ri, rt) = (Some(&rope.image), Some(&rope.text));
        let [tq, tk, tv] = project(text, [&self.add_q_proj, &self.add_k_proj, &self.add_v_proj]);
        let [iq, ik, iv] = project(image, [&self.to_q, &self.to_k, &self.to_v]);
        let q = Tensor::cat(
            &[
                self.heads_of(tq, Some(&self.norm_added_q), rt),
                self.heads_of(iq, Some(&self.norm_q), ri),
            ],
            1,
        );
        let k = Tensor::cat(
            &[
                self.heads_of(tk, Some(&self.norm_added_k), rt),
                self.heads_of(ik, Some(&self.norm_k), ri),
            ],
            1,
        );
        let v = Tensor::cat(&[self.heads_of(tv, None, None), self.heads_of(iv, None, None)], 1);
        let out = keys.attention(&q, &k, &v);
        let (b, n, h, d) = out.size4().expect("4-d attention output");
        let out = out.reshape([b, n, h * d]);
        let l = text.size()[1];
        let text_out = self.to_add_out.forward(&out.narrow(1, 0, l));
        let image_out = self.to_out.forward(&out.narrow(1, l, n - l));
        (image_out, text_out)
    }
}

/// Per-token modulation `(shift, scale, gate)`, each broadcastable to (B, S, D).
struct Modulation {
    shift: Tensor,
    scale: Tensor,
    gate: Tensor,
}

impl Modulation {
    /// Splits (B, 3D) parameters; with `select` (B, S) (the Edit models' `zero_cond_t`), the
    /// parameters are (2B, 3D) and token `s` of row `b` takes row `b` where `select` is 0 and row
    /// `B + b` where it is 1.
    fn new(params: &Tensor, select: Option<&Tensor>) -> Self {
        let parts = params.chunk(3, -1);
        let pick = |p: &Tensor| match select {
            None => p.unsqueeze(1),
            Some(index) => {
                let halves = p.chunk(2, 0);
                let first = index.unsqueeze(-1).eq(0);
                halves[0].unsqueeze(1).where_self(&first, &halves[1].unsqueeze(1))
            }
        };
        Self { shift: pick(&parts[0]), scale: pick(&parts[1]), gate: pick(&parts[2]) }
    }

    fn apply(&self, x: &Tensor) -> Tensor {
        x * (&self.scale + 1.0) + &self.shift
    }
}

/// One dual-stream block.
pub struct QwenImageTransformerBlock {
    /// `img_mod.1`: SiLU(temb) → 6 chunks (shift, scale, gate) × (attention, MLP).
    pub img_mod: Linear,
    pub txt_mod: Linear,
    pub attn: JointAttention,
    pub img_mlp: FeedForward,
    pub txt_mlp: FeedForward,
}

impl QwenImageTransformerBlock {
    pub fn new(scope: &Scope<'_>, dim: i64, heads: i64, head_dim: i64) -> Self {
        Self {
            img_mod: (&(scope / "img_mod") / 1).linear(dim, 6 * dim, true),
            txt_mod: (&(scope / "txt_mod") / 1).linear(dim, 6 * dim, true),
            attn: JointAttention::new(&(scope / "attn"), dim, heads, head_dim),
            img_mlp: FeedForward::new(&(scope / "img_mlp"), dim),
            txt_mlp: FeedForward::new(&(scope / "txt_mlp"), dim),
        }
    }

    /// One block on image tokens (B, S, D) and text tokens (B, L, D). With `select` (zero_cond_t),
    /// `temb` holds 2B rows: the sample's timestep, then timestep zero. The tokens, `select` and
    /// `rope` are this rank's shares when `keys` split them.
    pub fn forward(
        &self,
        image: &Tensor,
        text: &Tensor,
        temb: &Tensor,
        rope: &RotaryAngles,
        select: Option<&Tensor>,
        keys: &Keys<'_>,
    ) -> (Tensor, Tensor) {
        let img_params = self.img_mod.forward(&temb.silu()).chunk(2, -1);
        let text_temb = match select {
            Some(_) => temb.chunk(2, 0)[0].shallow_clone(),
            None => temb.shallow_clone(),
        };
        let txt_params = self.txt_mod.forward(&text_temb.silu()).chunk(2, -1);
        let (img1, img2) =
            (Modulation::new(&img_params[0], select), Modulation::new(&img_params[1], select));
        let (txt1, txt2) =
            (Modulation::new(&txt_params[0], None), Modulation::new(&txt_params[1], None));

        let (img_attn, txt_attn) = self.attn.forward(
            &img1.apply(&layer_norm(image, EPS)),
            &txt1.apply(&layer_norm(text, EPS)),
            rope,
            keys,
        );
        let image = image + &img1.gate * img_attn;
        let text = text + &txt1.gate * txt_attn;

        let image =
            &image + &img2.gate * self.img_mlp.forward(&img2.apply(&layer_norm(&image, EPS)));
        let text = &text + &txt2.gate * self.txt_mlp.forward(&txt2.apply(&layer_norm(&text, EPS)));
        (image, text)
    }
}
