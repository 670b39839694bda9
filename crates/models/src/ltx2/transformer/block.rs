//! `LTX2VideoTransformerBlock`: video and audio streams side by side. Each takes self-attention,
//! cross-attention to its text, then the two meet (audio-to-video attention updates the video,
//! video-to-audio the audio), then each its feed-forward; the timestep drives every shift, scale
//! and gate through per-block tables added to global modulations.

use tch::Tensor;

use super::attention::{AttentionSpec, BlockNorm, Ltx2Attention, Over};
use super::config::Ltx2TransformerConfig;
use super::rope::Ropes;
use crate::nn::{gelu_tanh, Linear, Scope};
use crate::sequence::Keys;

/// `FeedForward(dim, mult 4, "gelu-approximate", bias)`: `net.0.proj` → GELU(tanh) → `net.2`.
pub struct FeedForward {
    pub proj_in: Linear,
    pub proj_out: Linear,
}

impl FeedForward {
    fn new(s: &Scope<'_>, dim: i64, bias: bool) -> Self {
        let net = s / "net";
        Self {
            proj_in: (&(&net / 0) / "proj").linear(dim, 4 * dim, bias),
            proj_out: (&net / 2).linear(4 * dim, dim, bias),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        self.proj_out.forward(&gelu_tanh(&self.proj_in.forward(x)))
    }
}

/// What every block reads besides the two token streams: the (projected) text states and the
/// global modulations, all made from trainable weights outside the blocks.
pub struct BlockInputs<'a> {
    /// Video and audio text states (B, L, D) and (B, L, D_a).
    pub text: &'a Tensor,
    pub audio_text: &'a Tensor,
    /// `time_embed` / `audio_time_embed` modulations (B, 1, n·D), n = 6 or 9; the video's is
    /// (B, S_v, n·D) with per-token timesteps (this rank's tokens with a group).
    pub temb: &'a Tensor,
    pub audio_temb: &'a Tensor,
    /// Audio↔video scale and shift (B, 1, 4·D) and the gate (B, 1, D) of each stream.
    pub cross_scale_shift: &'a Tensor,
    pub audio_cross_scale_shift: &'a Tensor,
    pub cross_gate: &'a Tensor,
    pub audio_cross_gate: &'a Tensor,
    /// `prompt_adaln` / `audio_prompt_adaln` (B, 1, 2·D), with text modulation (LTX-2.3).
    pub prompt: Option<(&'a Tensor, &'a Tensor)>,
    /// Additive key bias of the text (B, 1, 1, L).
    pub text_bias: Option<&'a Tensor>,
    pub ropes: &'a Ropes,
    /// The keys of attention over the video tokens (video self-attention, video→audio) and over
    /// the audio tokens (audio self-attention, audio→video).
    pub video_keys: &'a Keys<'a>,
    pub audio_keys: &'a Keys<'a>,
}

/// One block (`transformer_blocks.{i}`).
pub struct Ltx2Block {
    pub norm1: BlockNorm,
    pub attn1: Ltx2Attention,
    pub audio_norm1: BlockNorm,
    pub audio_attn1: Ltx2Attention,
    pub norm2: BlockNorm,
    pub attn2: Ltx2Attention,
    pub audio_norm2: BlockNorm,
    pub audio_attn2: Ltx2Attention,
    pub audio_to_video_norm: BlockNorm,
    pub audio_to_video_attn: Ltx2Attention,
    pub video_to_audio_norm: BlockNorm,
    pub video_to_audio_attn: Ltx2Attention,
    pub norm3: BlockNorm,
    pub ff: FeedForward,
    pub audio_norm3: BlockNorm,
    pub audio_ff: FeedForward,
    /// (n, D): shift, scale, gate of self-attention and feed-forward (and of the text query with
    /// `cross_attn_mod`), added to the global modulations.
    pub scale_shift_table: Tensor,
    pub audio_scale_shift_table: Tensor,
    /// (2, D): shift and scale of the text states, with either text modulation flag.
    pub prompt_scale_shift_table: Option<Tensor>,
    pub audio_prompt_scale_shift_table: Option<Tensor>,
    /// (5, D): a2v scale, a2v shift, v2a scale, v2a shift, and the gate of this stream's update.
    pub video_a2v_cross_attn_scale_shift_table: Tensor,
    pub audio_a2v_cross_attn_scale_shift_table: Tensor,
    cross_attn_mod: bool,
    audio_cross_attn_mod: bool,
}

impl Ltx2Block {
    pub fn new(s: &Scope<'_>, c: &Ltx2TransformerConfig) -> Self {
        let (dim, audio_dim) = (c.inner_dim(), c.audio_inner_dim());
        let norm = |name: &str, width| {
            BlockNorm::new(&(s / name), width, c.norm_elementwise_affine, c.norm_eps)
        };
        let attn = |name: &str, query_dim, context_dim, audio_heads: bool, gated| {
            let (heads, head_dim) = if audio_heads {
                (c.audio_num_attention_heads, c.audio_attention_head_dim)
            } else {
                (c.num_attention_heads, c.attention_head_dim)
            };
            let spec = AttentionSpec {
                query_dim,
                context_dim,
                heads,
                head_dim,
                bias: c.attention_bias,
                out_bias: c.attention_out_bias,
                gated,
            };
            Ltx2Attention::new(&(s / name), &spec)
        };
        let (video_gate, audio_gate) = (c.gated_attn, c.audio_gated_attn);
        let rows = |modulated: bool| if modulated { 9 } else { 6 };
        let prompt = c.prompt_modulation();
        Self {
            norm1: norm("norm1", dim),
            attn1: attn("attn1", dim, dim, false, video_gate),
            audio_norm1: norm("audio_norm1", audio_dim),
            audio_attn1: attn("audio_attn1", audio_dim, audio_dim, true, audio_gate),
            norm2: norm("norm2", dim),
            attn2: attn("attn2", dim, c.cross_attention_dim, false, video_gate),
            audio_norm2: norm("audio_norm2", audio_dim),
            audio_attn2: attn(
                "audio_attn2",
                audio_dim,
                c.audio_cross_attention_dim,
                true,
                audio_gate,
            ),
            audio_to_video_norm: norm("audio_to_video_norm", dim),
            audio_to_video_attn: attn("audio_to_video_attn", dim, audio_dim, true, video_gate),
            video_to_audio_norm: norm("video_to_audio_norm", audio_dim),
            video_to_audio_attn: attn("video_to_audio_attn", audio_dim, dim, true, audio_gate),
            norm3: norm("norm3", dim),
            ff: FeedForward::new(&(s / "ff"), dim, c.ff_bias),
            audio_norm3: norm("audio_norm3", audio_dim),
            audio_ff: FeedForward::new(&(s / "audio_ff"), audio_dim, c.audio_ff_bias),
            scale_shift_table: s.var("scale_shift_table", &[rows(c.cross_attn_mod), dim]),
            audio_scale_shift_table: s
                .var("audio_scale_shift_table", &[rows(c.audio_cross_attn_mod), audio_dim]),
            prompt_scale_shift_table: prompt.then(|| s.var("prompt_scale_shift_table", &[2, dim])),
            audio_prompt_scale_shift_table: prompt
                .then(|| s.var("audio_prompt_scale_shift_table", &[2, audio_dim])),
            video_a2v_cross_attn_scale_shift_table: s
                .var("video_a2v_cross_attn_scale_shift_table", &[5, dim]),
            audio_a2v_cross_attn_scale_shift_table: s
                .var("audio_a2v_cross_attn_scale_shift_table", &[5, audio_dim]),
            cross_attn_mod: c.cross_attn_mod,
            audio_cross_attn_mod: c.audio_cross_attn_mod,
        }
    }

    /// The video (B, S_v, D) and audio (B, S_a, D_a) streams after this block (this rank's
    /// tokens of each with a sequence-parallel group).
    pub fn forward(&self, x: &Tensor, a: &Tensor, i: &BlockInputs<'_>) -> (Tensor, Tensor) {
        let r = i.ropes;
        let v = modulations(&self.scale_shift_table, i.temb);
        let m = modulations(&self.audio_scale_shift_table, i.audio_temb);
        let adapt = |t: &Tensor, shift: &Tensor, scale: &Tensor| t * (scale + 1.0) + shift;
        let (video, audio) = (Over::Tokens(i.video_keys), Over::Tokens(i.audio_keys));
        let text_keys = || Over::Text(i.text_bias);

        let normed = adapt(&self.norm1.forward(x), &v[0], &v[1]);
        let x = x + self.attn1.forward(&normed, None, video, Some(&r.video), None) * &v[2];
        let normed = adapt(&self.audio_norm1.forward(a), &m[0], &m[1]);
        let a = a + self.audio_attn1.forward(&normed, None, audio, Some(&r.audio), None) * &m[2];

        // Text cross-attention; with text modulation the text itself is shifted and scaled.
        let (text, audio_text) = match (
            i.prompt,
            &self.prompt_scale_shift_table,
            &self.audio_prompt_scale_shift_table,
        ) {
            (Some((p, pa)), Some(table), Some(audio_table)) => {
                let (tv, ta) = (modulations(table, p), modulations(audio_table, pa));
                (adapt(i.text, &tv[0], &tv[1]), adapt(i.audio_text, &ta[0], &ta[1]))
            }
            _ => (i.text.shallow_clone(), i.audio_text.shallow_clone()),
        };
        let mut normed = self.norm2.forward(&x);
        if self.cross_attn_mod {
            normed = adapt(&normed, &v[6], &v[7]);
        }
        let update = self.attn2.forward(&normed, Some(&text), text_keys(), None, None);
        let update = if self.cross_attn_mod { update * &v[8] } else { update };
        let x = x + update;
        let mut normed = self.audio_norm2.forward(&a);
        if self.audio_cross_attn_mod {
            normed = adapt(&normed, &m[6], &m[7]);
        }
        let update = self.audio_attn2.forward(&normed, Some(&audio_text), text_keys(), None, None);
        let update = if self.audio_cross_attn_mod { update * &m[8] } else { update };
        let a = a + update;

        // Audio↔video: both directions read the streams as they are here.
        let normed = self.audio_to_video_norm.forward(&x);
        let audio_normed = self.video_to_audio_norm.forward(&a);
        let table = &self.video_a2v_cross_attn_scale_shift_table;
        let vc = modulations(&table.narrow(0, 0, 4), i.cross_scale_shift);
        let video_gate = modulations(&table.narrow(0, 4, 1), i.cross_gate);
        let table = &self.audio_a2v_cross_attn_scale_shift_table;
        let ac = modulations(&table.narrow(0, 0, 4), i.audio_cross_scale_shift);
        let audio_gate = modulations(&table.narrow(0, 4, 1), i.audio_cross_gate);
        let (q, kv) = (adapt(&normed, &vc[1], &vc[0]), adapt(&audio_normed, &ac[1], &ac[0]));
        let a2v = self.audio_to_video_attn.forward(
            &q,
            Some(&kv),
            audio,
            Some(&r.cross_video),
            Some(&r.cross_audio),
        );
        let x = x + &video_gate[0] * a2v;
        let (kv, q) = (adapt(&normed, &vc[3], &vc[2]), adapt(&audio_normed, &ac[3], &ac[2]));
        let v2a = self.video_to_audio_attn.forward(
            &q,
            Some(&kv),
            video,
            Some(&r.cross_audio),
            Some(&r.cross_video),
        );
        let a = a + &audio_gate[0] * v2a;

        let normed = adapt(&self.norm3.forward(&x), &v[3], &v[4]);
        let x = &x + self.ff.forward(&normed) * &v[5];
        let normed = adapt(&self.audio_norm3.forward(&a), &m[3], &m[4]);
        let a = &a + self.audio_ff.forward(&normed) * &m[5];
        (x, a)
    }
}

/// `table` (n, D) plus the modulation (B, R, n·D), per sample (R = 1) or per token: n tensors
/// (B, R, D).
fn modulations(table: &Tensor, global: &Tensor) -> Vec<Tensor> {
    let (n, dim) = (table.size()[0], table.size()[1]);
    let (b, rows) = (global.size()[0], global.size()[1]);
    let values = table.to_kind(global.kind()).view([1, 1, n, dim]) + global.view([b, rows, n, dim]);
    values.unbind(2)
}
