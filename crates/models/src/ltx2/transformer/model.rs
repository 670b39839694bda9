//! `LTX2VideoTransformer3DModel`: packed video and audio tokens in, their velocities out. The
//! timestep embedders make the global modulations, the caption projections (LTX-2.0) the text
//! states, the blocks run both streams, and an adaLN output norm and projection end each.

use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::block::{BlockInputs, Ltx2Block};
use super::config::Ltx2TransformerConfig;
use super::rope::Ropes;
use crate::lora::LoraConfig;
use crate::model_weights::{ModelWeights, WeightsBuilder};
use crate::nn::{gelu_tanh, layer_norm, timestep_features, Linear, Mlp, Scope, TIMESTEP_CHANNELS};
use crate::sequence::{Role, Stream};
use crate::ModelError;

/// What sequence parallelism splits: the video and the audio tokens (the keys of their
/// self-attentions and of the audio↔video attentions; text cross-attention stays local), then
/// their rotary tables in [`Ropes::tables`]' order. Per-sample modulations are not split;
/// per-token ones ([`PER_TOKEN`]) are.
const SEQUENCE: [Stream; 10] = [
    Stream { name: "video", dim: 1, role: Role::Keys },
    Stream { name: "audio", dim: 1, role: Role::Keys },
    Stream { name: "video cos", dim: 1, role: Role::Follows },
    Stream { name: "video sin", dim: 1, role: Role::Follows },
    Stream { name: "audio cos", dim: 1, role: Role::Follows },
    Stream { name: "audio sin", dim: 1, role: Role::Follows },
    Stream { name: "cross video cos", dim: 1, role: Role::Follows },
    Stream { name: "cross video sin", dim: 1, role: Role::Follows },
    Stream { name: "cross audio cos", dim: 1, role: Role::Follows },
    Stream { name: "cross audio sin", dim: 1, role: Role::Follows },
];

/// The video stream's per-token timestep embeddings and modulations (B, S_v, …), split with the
/// video tokens.
const PER_TOKEN: Stream = Stream { name: "video per-token timesteps", dim: 1, role: Role::Follows };

/// `LTX2AdaLayerNormSingle`: sinusoidal timestep features → `emb.timestep_embedder` (SiLU MLP)
/// → SiLU → `linear` (n modulations).
pub struct AdaLnSingle {
    pub timestep_embedder: Mlp,
    pub linear: Linear,
}

impl AdaLnSingle {
    fn new(s: &Scope<'_>, dim: i64, n: i64) -> Self {
        Self {
            timestep_embedder: Mlp::new(
                &(&(s / "emb") / "timestep_embedder"),
                TIMESTEP_CHANNELS,
                dim,
            ),
            linear: (s / "linear").linear(dim, n * dim, true),
        }
    }

    /// Modulations (B, R, n·D) and the embedding (B, R, D) of timesteps `t`: (B,) per sample
    /// (R = 1) or (B, R) per token.
    fn forward(&self, t: &Tensor, kind: Kind) -> (Tensor, Tensor) {
        let b = t.size()[0];
        let features = timestep_features(&t.reshape([-1]), TIMESTEP_CHANNELS, 1.0).to_kind(kind);
        let embedding = self.timestep_embedder.forward(&features);
        let rows = |x: Tensor| x.view([b, -1, x.size()[1]]);
        (rows(self.linear.forward(&embedding.silu())), rows(embedding))
    }
}

/// `PixArtAlphaTextProjection`: `linear_1` → GELU(tanh) → `linear_2`.
pub struct CaptionProjection {
    pub linear_1: Linear,
    pub linear_2: Linear,
}

impl CaptionProjection {
    fn new(s: &Scope<'_>, input: i64, dim: i64) -> Self {
        Self {
            linear_1: (s / "linear_1").linear(input, dim, true),
            linear_2: (s / "linear_2").linear(dim, dim, true),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        self.linear_2.forward(&gelu_tanh(&self.linear_1.forward(x)))
    }
}

/// One forward's inputs, as LTX2Pipeline passes them.
pub struct Ltx2Inputs<'a> {
    /// Packed video tokens (B, S_v, in_channels), S_v = (F/pt)·(H/p)·(W/p).
    pub video: &'a Tensor,
    /// Packed audio tokens (B, S_a, audio_in_channels), one per audio latent frame.
    pub audio: &'a Tensor,
    /// The connectors' video and audio text states (B, L, ·).
    pub video_text: &'a Tensor,
    pub audio_text: &'a Tensor,
    /// (B, L): 1 for tokens, 0 for padding, shared by both text streams.
    pub text_mask: Option<&'a Tensor>,
    /// The scheduler's timestep `1000·σ` (B,): diffusers' `audio_timestep` and `sigma`, and its
    /// `timestep` unless `video_timestep` is given.
    pub timestep: &'a Tensor,
    /// Per-token video timesteps (B, S_v): LTX2ImageToVideoPipeline's `timestep`, 0 on the held
    /// first frame's tokens.
    pub video_timestep: Option<&'a Tensor>,
    /// The latent video's (frames, height, width).
    pub video_shape: [i64; 3],
    /// Frame rate the positions are conditioned on: (B,) or one for all (0-dim).
    pub fps: &'a Tensor,
}

/// The LTX-2 denoiser: predicts video and audio flow-matching velocities (noise − data).
pub struct Ltx2Transformer {
    pub config: Ltx2TransformerConfig,
    pub proj_in: Linear,
    pub audio_proj_in: Linear,
    /// `caption_projection` and `audio_caption_projection` (with `use_prompt_embeddings`).
    pub caption_projection: Option<(CaptionProjection, CaptionProjection)>,
    pub time_embed: AdaLnSingle,
    pub audio_time_embed: AdaLnSingle,
    pub av_cross_attn_video_scale_shift: AdaLnSingle,
    pub av_cross_attn_audio_scale_shift: AdaLnSingle,
    pub av_cross_attn_video_a2v_gate: AdaLnSingle,
    pub av_cross_attn_audio_v2a_gate: AdaLnSingle,
    /// `prompt_adaln` and `audio_prompt_adaln` (with text modulation, LTX-2.3).
    pub prompt_adaln: Option<(AdaLnSingle, AdaLnSingle)>,
    pub transformer_blocks: Vec<Ltx2Block>,
    /// (2, D): shift and scale of the output norm, added to the timestep embedding.
    pub scale_shift_table: Tensor,
    pub audio_scale_shift_table: Tensor,
    pub proj_out: Linear,
    pub audio_proj_out: Linear,
    pub weights: ModelWeights,
}

impl Ltx2Transformer {
    /// Builds the module tree for `config` on `device`, with adapters when `lora` is given.
    pub fn new(
        config: &Ltx2TransformerConfig,
        device: Device,
        kind: Kind,
        lora: Option<&LoraConfig>,
    ) -> Result<Self, ModelError> {
        config.validate().map_err(ModelError::Input)?;
        let weights = WeightsBuilder::new(device, kind, lora);
        let root = weights.root();
        let c = config;
        let (dim, audio_dim) = (c.inner_dim(), c.audio_inner_dim());
        let rows = |modulated: bool| if modulated { 9 } else { 6 };
        let ada = |name: &str, width, n| AdaLnSingle::new(&(&root / name), width, n);
        let list = &root / "transformer_blocks";
        Ok(Self {
            proj_in: (&root / "proj_in").linear(c.in_channels, dim, true),
            audio_proj_in: (&root / "audio_proj_in").linear(c.audio_in_channels, audio_dim, true),
            caption_projection: c.use_prompt_embeddings.then(|| {
                (
                    CaptionProjection::new(
                        &(&root / "caption_projection"),
                        c.caption_channels,
                        dim,
                    ),
                    CaptionProjection::new(
                        &(&root / "audio_caption_projection"),
                        c.caption_channels,
                        audio_dim,
                    ),
                )
            }),
            time_embed: ada("time_embed", dim, rows(c.cross_attn_mod)),
            audio_time_embed: ada("audio_time_embed", audio_dim, rows(c.audio_cross_attn_mod)),
            av_cross_attn_video_scale_shift: ada("av_cross_attn_video_scale_shift", dim, 4),
            av_cross_attn_audio_scale_shift: ada("av_cross_attn_audio_scale_shift", audio_dim, 4),
            av_cross_attn_video_a2v_gate: ada("av_cross_attn_video_a2v_gate", dim, 1),
            av_cross_attn_audio_v2a_gate: ada("av_cross_attn_audio_v2a_gate", audio_dim, 1),
            prompt_adaln: c
                .prompt_modulation()
                .then(|| (ada("prompt_adaln", dim, 2), ada("audio_prompt_adaln", audio_dim, 2))),
            transformer_blocks: (0..c.num_layers)
                .map(|i| Ltx2Block::new(&(&list / i), c))
                .collect(),
            scale_shift_table: root.var("scale_shift_table", &[2, dim]),
            audio_scale_shift_table: root.var("audio_scale_shift_table", &[2, audio_dim]),
            proj_out: (&root / "proj_out").linear(dim, c.out_dim(), true),
            audio_proj_out: (&root / "audio_proj_out").linear(audio_dim, c.audio_out_dim(), true),
            config: config.clone(),
            weights: weights.finish(&["transformer_blocks"])?,
        })
    }

    /// Loads a diffusers `transformer/` directory (config.json + safetensors, sharded or not).
    pub fn load(
        dir: &Path,
        device: Device,
        kind: Kind,
        lora: Option<&LoraConfig>,
    ) -> Result<Self, ModelError> {
        crate::denoiser::load_component(
            dir,
            kind,
            |c: &Ltx2TransformerConfig| Self::new(c, device, kind, lora),
            |m| &mut m.weights,
        )
    }

    /// diffusers' forward as LTX2Pipeline and LTX2ImageToVideoPipeline call it (no isolation or
    /// guidance perturbation, `use_cross_timestep`): the video (B, S_v, out_channels) and audio
    /// (B, S_a, audio_out_channels) velocities. Only the video stream's own modulations read
    /// per-token timesteps; the audio's, the text modulation and the audio↔video attentions read
    /// the per-sample one.
    pub fn forward(&self, inputs: &Ltx2Inputs<'_>) -> Result<(Tensor, Tensor), ModelError> {
        self.check_inputs(inputs)?;
        let c = &self.config;
        let kind = self.proj_in.weight.kind();
        let (b, audio_frames) = (inputs.video.size()[0], inputs.audio.size()[1]);
        let device = inputs.video.device();
        let ropes = Ropes::new(c, b, inputs.video_shape, inputs.fps, audio_frames, device);
        let x = self.proj_in.forward(&inputs.video.to_kind(kind));
        let a = self.audio_proj_in.forward(&inputs.audio.to_kind(kind));
        // This rank's tokens of both streams from here to the output projections (all without a
        // group).
        let video_tokens = x.size()[1];
        let [c0, c1, c2, c3, c4, c5, c6, c7] = ropes.tables().map(Tensor::shallow_clone);
        let (split, [x, a, tables @ ..]) =
            self.weights.split_sequence(&SEQUENCE, [x, a, c0, c1, c2, c3, c4, c5, c6, c7], None);
        let ropes = ropes.with_tables(tables);
        let (video_keys, audio_keys) = (split.keys_of("video"), split.keys_of("audio"));

        let t = inputs.timestep.to_kind(Kind::Float).reshape([-1]);
        let (temb, embedded) = match inputs.video_timestep {
            Some(per_token) => {
                let (temb, embedded) =
                    self.time_embed.forward(&per_token.to_kind(Kind::Float), kind);
                (split.split(&PER_TOKEN, &temb), split.split(&PER_TOKEN, &embedded))
            }
            None => self.time_embed.forward(&t, kind),
        };
        let (audio_temb, audio_embedded) = self.audio_time_embed.forward(&t, kind);
        let prompt =
            self.prompt_adaln.as_ref().map(|(v, a)| (v.forward(&t, kind).0, a.forward(&t, kind).0));
        let gate_t = &t * (c.cross_attn_timestep_scale_multiplier / c.timestep_scale_multiplier);
        let cross_scale_shift = self.av_cross_attn_video_scale_shift.forward(&t, kind).0;
        let cross_gate = self.av_cross_attn_video_a2v_gate.forward(&gate_t, kind).0;
        let audio_cross_scale_shift = self.av_cross_attn_audio_scale_shift.forward(&t, kind).0;
        let audio_cross_gate = self.av_cross_attn_audio_v2a_gate.forward(&gate_t, kind).0;

        let (mut text, mut audio_text) =
            (inputs.video_text.to_kind(kind), inputs.audio_text.to_kind(kind));
        if let Some((video, audio)) = &self.caption_projection {
            (text, audio_text) = (video.forward(&text), audio.forward(&audio_text));
        }
        // diffusers' additive mask: −10000 on padding.
        let text_bias = inputs
            .text_mask
            .map(|m| ((m.to_kind(kind) * -1.0 + 1.0) * -10000.0).view([b, 1, 1, -1]));

        // The blocks' inputs: both streams, then what every block reads (see `BlockInputs`).
        let mut state = vec![
            x,
            a,
            text,
            audio_text,
            temb,
            audio_temb,
            cross_scale_shift,
            audio_cross_scale_shift,
            cross_gate,
            audio_cross_gate,
        ];
        if let Some((p, pa)) = prompt {
            state.extend([p, pa]);
        }
        for (i, block) in self.transformer_blocks.iter().enumerate() {
            // Owned by the closure: checkpointing runs it again in backward, after this returns.
            let (ropes, text_bias) =
                (ropes.shallow_clone(), text_bias.as_ref().map(Tensor::shallow_clone));
            let (video_keys, audio_keys) = (video_keys.clone(), audio_keys.clone());
            let out = self.weights.run_block("transformer_blocks", i, &state, move |t| {
                let given = BlockInputs {
                    text: &t[2],
                    audio_text: &t[3],
                    temb: &t[4],
                    audio_temb: &t[5],
                    cross_scale_shift: &t[6],
                    audio_cross_scale_shift: &t[7],
                    cross_gate: &t[8],
                    audio_cross_gate: &t[9],
                    prompt: t.get(10).zip(t.get(11)),
                    text_bias: text_bias.as_ref(),
                    ropes: &ropes,
                    video_keys: &video_keys,
                    audio_keys: &audio_keys,
                };
                let (x, a) = block.forward(&t[0], &t[1], &given);
                vec![x, a]
            })?;
            let [x, a] = <[Tensor; 2]>::try_from(out).expect("a block returns 2 streams");
            state[0] = x;
            state[1] = a;
        }
        let out = |x: &Tensor, table: &Tensor, embedded: &Tensor, proj: &Linear| {
            let values = table.to_kind(kind).unsqueeze(0).unsqueeze(0) + embedded.unsqueeze(2);
            let (shift, scale) = (values.select(2, 0), values.select(2, 1));
            proj.forward(&(layer_norm(x, 1e-6) * (scale + 1.0) + shift))
        };
        let video = out(&state[0], &self.scale_shift_table, &embedded, &self.proj_out);
        let audio =
            out(&state[1], &self.audio_scale_shift_table, &audio_embedded, &self.audio_proj_out);
        Ok((split.gather(video, video_tokens)?, split.gather(audio, audio_frames)?))
    }

    /// Video tokens of a latent video of `[frames, height, width]` cells.
    pub fn video_tokens(&self, [f, h, w]: [i64; 3]) -> i64 {
        let (p, pt) = (self.config.patch_size, self.config.patch_size_t);
        (f / pt) * (h / p) * (w / p)
    }

    fn check_inputs(&self, i: &Ltx2Inputs<'_>) -> Result<(), ModelError> {
        let c = &self.config;
        let (p, pt) = (c.patch_size, c.patch_size_t);
        let [f, h, w] = i.video_shape;
        let fail = |what: String| Err(ModelError::Input(format!("LTX-2 transformer: {what}")));
        if f <= 0 || h <= 0 || w <= 0 || f % pt != 0 || h % p != 0 || w % p != 0 {
            return fail(format!(
                "latent video shape {:?} must be positive multiples of the patch ({pt}, {p}, {p})",
                i.video_shape
            ));
        }
        let (vs, a_s) = (i.video.size(), i.audio.size());
        let b = vs[0];
        let tokens = self.video_tokens(i.video_shape);
        if vs != [b, tokens, c.in_channels] {
            return fail(format!(
                "video tokens {vs:?}, expected [{b}, {tokens}, {}]",
                c.in_channels
            ));
        }
        if a_s.len() != 3 || a_s[0] != b || a_s[1] < 1 || a_s[2] != c.audio_in_channels {
            return fail(format!(
                "audio tokens {a_s:?}, expected [{b}, S_a ≥ 1, {}]",
                c.audio_in_channels
            ));
        }
        let (ts, tas) = (i.video_text.size(), i.audio_text.size());
        let (dv, da) = (c.video_text_dim(), c.audio_text_dim());
        let len = ts.get(1).copied().unwrap_or(0);
        if ts != [b, len, dv] || tas != [b, len, da] {
            return fail(format!(
                "text states {ts:?} and {tas:?}, expected [{b}, L, {dv}] and [{b}, L, {da}]"
            ));
        }
        if let Some(m) = i.text_mask {
            if m.size() != [b, len] {
                return fail(format!("text mask {:?}, expected [{b}, {len}]", m.size()));
            }
        }
        if i.timestep.size() != [b] {
            return fail(format!("timestep {:?}, expected [{b}]", i.timestep.size()));
        }
        if let Some(t) = i.video_timestep.filter(|t| t.size() != [b, tokens]) {
            return fail(format!(
                "per-token video timestep {:?}, expected [{b}, {tokens}]",
                t.size()
            ));
        }
        if i.fps.numel() != 1 && i.fps.size() != [b] {
            return fail(format!("fps {:?}, expected [{b}] or one value", i.fps.size()));
        }
        Ok(())
    }
}
