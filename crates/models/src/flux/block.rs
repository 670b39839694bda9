//! FLUX.1's transformer blocks: double-stream (`FluxTransformerBlock`: image and text streams
//! with their own AdaLN-Zero, joint attention, feed-forwards) and single-stream
//! (`FluxSingleTransformerBlock`: `[text; image]` through attention and an MLP in parallel).

use tch::Tensor;

use super::rope::{apply_rotary, RotaryTables};
use crate::nn::{gelu_tanh, layer_norm, project, FeedForward, Linear, RmsNorm, Scope};
use crate::sequence::Keys;

const EPS: f64 = 1e-6;

/// Query, key and value projections of one stream with per-head RMS norms on queries and keys.
pub struct Projections {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub norm_q: RmsNorm,
    pub norm_k: RmsNorm,
}

impl Projections {
    /// `names`: the projections' and the norms' names under `scope`; FLUX.2's have no biases.
    pub(crate) fn new(
        scope: &Scope<'_>,
        names: [&str; 5],
        dim: i64,
        head_dim: i64,
        bias: bool,
    ) -> Self {
        let qkv = scope.linears(dim, [(names[0], dim), (names[1], dim), (names[2], dim)], bias);
        Self::with(qkv, scope, [names[3], names[4]], head_dim)
    }

    /// Projections `qkv` made elsewhere, with the norms `norms` under `scope`.
    fn with(qkv: [Linear; 3], scope: &Scope<'_>, norms: [&str; 2], head_dim: i64) -> Self {
        let norm = |name: &str| RmsNorm::new(&(scope / name), head_dim, EPS);
        let [q, k, v] = qkv;
        Self { q, k, v, norm_q: norm(norms[0]), norm_k: norm(norms[1]) }
    }

    /// (B, S, D) → normed queries, normed keys, values, each (B, S, H, d).
    pub(crate) fn heads(&self, x: &Tensor, heads: i64) -> [Tensor; 3] {
        let (b, s) = (x.size()[0], x.size()[1]);
        self.heads_of(project(x, [&self.q, &self.k, &self.v]), b, s, heads)
    }

    /// Projected queries, keys and values (B, S, D) → normed queries, normed keys, values.
    fn heads_of(&self, [q, k, v]: [Tensor; 3], b: i64, s: i64, heads: i64) -> [Tensor; 3] {
        let split = |t: Tensor| t.view([b, s, heads, -1]);
        [self.norm_q.forward(&split(q)), self.norm_k.forward(&split(k)), split(v)]
    }
}

/// Attention over (B, S, H, d) heads with rotary positions on queries and keys → (B, S, H·d),
/// over `keys`.
pub(crate) fn rotary_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    rope: &RotaryTables,
    keys: &Keys<'_>,
) -> Tensor {
    let (q, k) = (apply_rotary(q, rope), apply_rotary(k, rope));
    let out = keys.attention(&q, &k, v);
    let (b, n, h, d) = out.size4().expect("4-d attention output");
    out.reshape([b, n, h * d])
}

/// `x·(1 + scale) + shift` with (B, D) parameters.
pub(crate) fn modulate(x: &Tensor, shift: &Tensor, scale: &Tensor) -> Tensor {
    x * (scale.unsqueeze(1) + 1.0) + shift.unsqueeze(1)
}

/// One double-stream block.
pub struct FluxTransformerBlock {
    /// `norm1.linear`: SiLU(temb) → (shift, scale, gate) × (attention, MLP) of the image stream.
    pub norm1: Linear,
    pub norm1_context: Linear,
    /// `attn.{to_q, to_k, to_v, norm_q, norm_k}`.
    pub image: Projections,
    /// `attn.{add_q_proj, add_k_proj, add_v_proj, norm_added_q, norm_added_k}`.
    pub text: Projections,
    pub to_out: Linear,
    pub to_add_out: Linear,
    pub ff: FeedForward,
    pub ff_context: FeedForward,
    pub heads: i64,
}

impl FluxTransformerBlock {
    pub fn new(scope: &Scope<'_>, dim: i64, heads: i64, head_dim: i64) -> Self {
        let attn = scope / "attn";
        Self {
            norm1: (&(scope / "norm1") / "linear").linear(dim, 6 * dim, true),
            norm1_context: (&(scope / "norm1_context") / "linear").linear(dim, 6 * dim, true),
            image: Projections::new(
                &attn,
                ["to_q", "to_k", "to_v", "norm_q", "norm_k"],
                dim,
                head_dim,
                true,
            ),
            text: Projections::new(
                &attn,
                ["add_q_proj", "add_k_proj", "add_v_proj", "norm_added_q", "norm_added_k"],
                dim,
                head_dim,
                true,
            ),
            to_out: (&(&attn / "to_out") / 0).linear(dim, dim, true),
            to_add_out: (&attn / "to_add_out").linear(dim, dim, true),
            ff: FeedForward::new(&(scope / "ff"), dim),
            ff_context: FeedForward::new(&(scope / "ff_context"), dim),
            heads,
        }
    }

    /// Image tokens (B, S, D) and text tokens (B, L, D) → both updated; rotary tables cover
    /// `[text; image]` (this rank's shares when `keys` split them).
    pub fn forward(
        &self,
        image: &Tensor,
        text: &Tensor,
        temb: &Tensor,
        rope: &RotaryTables,
        keys: &Keys<'_>,
    ) -> (Tensor, Tensor) {
        let temb = temb.silu();
        let m = self.norm1.forward(&temb).chunk(6, 1);
        let c = self.norm1_context.forward(&temb).chunk(6, 1);
        let [iq, ik, iv] =
            self.image.heads(&modulate(&layer_norm(image, EPS), &m[0], &m[1]), self.heads);
        let [tq, tk, tv] =
            self.text.heads(&modulate(&layer_norm(text, EPS), &c[0], &c[1]), self.heads);
        let out = rotary_attention(
            &Tensor::cat(&[tq, iq], 1),
            &Tensor::cat(&[tk, ik], 1),
            &Tensor::cat(&[tv, iv], 1),
            rope,
            keys,
        );
        let l = text.size()[1];
        let n = out.size()[1];
        let image = image + m[2].unsqueeze(1) * self.to_out.forward(&out.narrow(1, l, n - l));
        let text = text + c[2].unsqueeze(1) * self.to_add_out.forward(&out.narrow(1, 0, l));
        let ff = self.ff.forward(&modulate(&layer_norm(&image, EPS), &m[3], &m[4]));
        let image = &image + m[5].unsqueeze(1) * ff;
        let ff = self.ff_context.forward(&modulate(&layer_norm(&text, EPS), &c[3], &c[4]));
        let text = &text + c[5].unsqueeze(1) * ff;
        (image, text)
    }
}

/// One single-stream block over the joint `[text; image]` tokens.
pub struct FluxSingleTransformerBlock {
    /// `norm.linear`: SiLU(temb) → (shift, scale, gate).
    pub norm: Linear,
    /// `attn.{to_q, to_k, to_v, norm_q, norm_k}` (no output projection).
    pub attn: Projections,
    pub proj_mlp: Linear,
    /// Projects `[attention; MLP]` back to the stream width.
    pub proj_out: Linear,
    pub heads: i64,
}

impl FluxSingleTransformerBlock {
    pub fn new(scope: &Scope<'_>, dim: i64, heads: i64, head_dim: i64) -> Self {
        let mlp = 4 * dim;
        let attn = scope / "attn";
        // The attention's projections and the MLP's input read the same tokens: one GEMM.
        let outputs = [
            (&attn / "to_q", dim),
            (&attn / "to_k", dim),
            (&attn / "to_v", dim),
            (scope / "proj_mlp", mlp),
        ];
        let [q, k, v, proj_mlp] = scope.linears_at(dim, outputs, true);
        Self {
            norm: (&(scope / "norm") / "linear").linear(dim, 3 * dim, true),
            attn: Projections::with([q, k, v], &attn, ["norm_q", "norm_k"], head_dim),
            proj_mlp,
            proj_out: (scope / "proj_out").linear(dim + mlp, dim, true),
            heads,
        }
    }

    /// Joint tokens (B, L + S, D) → updated (this rank's shares of text and image when `keys`
    /// split them).
    pub fn forward(
        &self,
        x: &Tensor,
        temb: &Tensor,
        rope: &RotaryTables,
        keys: &Keys<'_>,
    ) -> Tensor {
        let m = self.norm.forward(&temb.silu()).chunk(3, 1);
        let normed = modulate(&layer_norm(x, EPS), &m[0], &m[1]);
        let a = &self.attn;
        let [q, k, v, mlp] = project(&normed, [&a.q, &a.k, &a.v, &self.proj_mlp]);
        let mlp = gelu_tanh(&mlp);
        let (b, s) = (normed.size()[0], normed.size()[1]);
        let [q, k, v] = a.heads_of([q, k, v], b, s, self.heads);
        let attn = rotary_attention(&q, &k, &v, rope, keys);
        x + m[2].unsqueeze(1) * self.proj_out.forward(&Tensor::cat(&[attn, mlp], 2))
    }
}
