//! LTX-2's rotary positions. Video tokens sit at the centre of their patch in (seconds, pixel row,
//! pixel column), audio tokens at the centre of their latent frame in seconds; each axis is a
//! fraction of its range, mapped to [-1, 1] and multiplied by frequencies `θ^x · π/2`. The
//! arithmetic is diffusers' op for op in f32 (the frequencies in f64 with
//! `rope_double_precision`): angles reach θ·π/2 ≈ 1.6e4 radians, where any other rounding order
//! would show.

use std::f64::consts::PI;

use tch::{Device, Kind, Tensor};

use super::config::Ltx2TransformerConfig;

/// Cosines and sines of one token stream: (B, S, D) to turn channel pairs (interleaved), or
/// (B, S, H, D / 2H) to turn the halves of each of H groups (split).
pub struct Rope {
    pub cos: Tensor,
    pub sin: Tensor,
    pub split: bool,
}

impl Rope {
    pub fn shallow_clone(&self) -> Self {
        Self { cos: self.cos.shallow_clone(), sin: self.sin.shallow_clone(), split: self.split }
    }

    /// Rotates queries or keys (B, S, D) in f32, returned in their dtype.
    pub fn apply(&self, x: &Tensor) -> Tensor {
        let size = x.size();
        let xf = x.to_kind(Kind::Float);
        let out = if self.split {
            let (heads, half) = (self.cos.size()[2], self.cos.size()[3]);
            let halves = xf.view([size[0], size[1], heads, 2, half]);
            let (first, second) = (halves.select(3, 0), halves.select(3, 1));
            let turned_first = &first * &self.cos + (-&self.sin) * &second;
            let turned_second = &second * &self.cos + &self.sin * &first;
            Tensor::stack(&[turned_first, turned_second], 3).view(size.as_slice())
        } else {
            let pairs = xf.view([size[0], size[1], -1, 2]);
            let (re, im) = (pairs.select(3, 0), pairs.select(3, 1));
            let turned = Tensor::stack(&[-im, re], -1).view(size.as_slice());
            &xf * &self.cos + turned * &self.sin
        };
        out.to_kind(x.kind())
    }
}

/// The four rotary tables of one forward.
pub struct Ropes {
    pub video: Rope,
    pub audio: Rope,
    /// The audio↔video attentions' tables of the video tokens (time only).
    pub cross_video: Rope,
    pub cross_audio: Rope,
}

impl Ropes {
    pub fn shallow_clone(&self) -> Self {
        Self {
            video: self.video.shallow_clone(),
            audio: self.audio.shallow_clone(),
            cross_video: self.cross_video.shallow_clone(),
            cross_audio: self.cross_audio.shallow_clone(),
        }
    }

    /// The eight tables: cosines and sines of the video, audio, cross video and cross audio
    /// tokens, each (B, S, …).
    pub fn tables(&self) -> [&Tensor; 8] {
        let ropes = [&self.video, &self.audio, &self.cross_video, &self.cross_audio];
        std::array::from_fn(|i| {
            let rope = ropes[i / 2];
            if i % 2 == 0 {
                &rope.cos
            } else {
                &rope.sin
            }
        })
    }

    /// These ropes with the tables of [`Self::tables`] replaced by `tables`, in its order.
    pub fn with_tables(&self, tables: [Tensor; 8]) -> Self {
        let split = self.video.split;
        let [vc, vs, ac, as_, cvc, cvs, cac, cas] = tables;
        let rope = |cos, sin| Rope { cos, sin, split };
        Self {
            video: rope(vc, vs),
            audio: rope(ac, as_),
            cross_video: rope(cvc, cvs),
            cross_audio: rope(cac, cas),
        }
    }

    /// Tables for `batch` samples of a `[frames, height, width]` latent video at `fps` (B,) or
    /// one for all (a 0-dim tensor) and `audio_frames` audio latent frames.
    pub fn new(
        c: &Ltx2TransformerConfig,
        batch: i64,
        video_shape: [i64; 3],
        fps: &Tensor,
        audio_frames: i64,
        device: Device,
    ) -> Self {
        let video = video_coords(c, batch, video_shape, fps, device);
        let audio = audio_coords(c, batch, audio_frames, device);
        let (dim, audio_dim) = (c.inner_dim(), c.audio_inner_dim());
        let (heads, audio_heads) = (c.num_attention_heads, c.audio_num_attention_heads);
        let video_max = [c.pos_embed_max_pos, c.base_height, c.base_width].map(|m| m as f64);
        let cross_max = [c.pos_embed_max_pos.max(c.audio_pos_embed_max_pos) as f64];
        let cross_dim = c.audio_cross_attention_dim;
        Self {
            video: table(c, &video, &video_max, dim, heads),
            audio: table(c, &audio, &[c.audio_pos_embed_max_pos as f64], audio_dim, audio_heads),
            cross_video: table(c, &video.narrow(1, 0, 1), &cross_max, cross_dim, heads),
            cross_audio: table(c, &audio, &cross_max, cross_dim, audio_heads),
        }
    }
}

/// `prepare_video_coords`: each token's [start, end) in (seconds, pixel row, pixel column),
/// (B, 3, S, 2) in f32. Temporal starts move back by the VAE's first-frame shortfall
/// (`causal_offset − frames factor`, clamped at 0) before the division by `fps`.
fn video_coords(
    c: &Ltx2TransformerConfig,
    batch: i64,
    [frames, height, width]: [i64; 3],
    fps: &Tensor,
    device: Device,
) -> Tensor {
    let opts = (Kind::Float, device);
    let (p, pt) = (c.patch_size, c.patch_size_t);
    let axes = [
        Tensor::arange_start_step(0, frames, pt, opts),
        Tensor::arange_start_step(0, height, p, opts),
        Tensor::arange_start_step(0, width, p, opts),
    ];
    let grid = Tensor::stack(&Tensor::meshgrid_indexing(&axes, "ij"), 0);
    let patch = Tensor::from_slice(&[pt as f32, p as f32, p as f32]).to_device(device);
    let ends = &grid + patch.view([3, 1, 1, 1]);
    let latent = Tensor::stack(&[grid, ends], -1).flatten(1, 3);
    let factors: Vec<f32> = c.vae_scale_factors.iter().map(|&f| f as f32).collect();
    let pixel = latent * Tensor::from_slice(&factors).to_device(device).view([3, 1, 1]);
    let shift = (c.causal_offset - c.vae_scale_factors[0]) as f64;
    let time = ((pixel.select(0, 0) + shift).clamp_min(0.0)).unsqueeze(0);
    let fps = fps.to_kind(Kind::Float).to_device(device).reshape([-1, 1, 1]);
    let time = (time / fps).expand([batch, -1, -1], false);
    let space = pixel.narrow(0, 1, 2).unsqueeze(0).expand([batch, -1, -1, -1], false);
    Tensor::cat(&[time.unsqueeze(1), space], 1)
}

/// `prepare_audio_coords`: each audio latent frame's [start, end) in seconds, (B, 1, S, 2) in
/// f32, through mel frames (`audio_scale_factor` per latent frame, shifted as the video's
/// frames) and the hop length.
fn audio_coords(c: &Ltx2TransformerConfig, batch: i64, frames: i64, device: Device) -> Tensor {
    let index = Tensor::arange(frames, (Kind::Float, device));
    let factor = c.audio_scale_factor as f64;
    let seconds = |mel: Tensor| {
        let mel = (mel + c.causal_offset as f64 - factor).clamp_min(0.0);
        mel * c.audio_hop_length as f64 / c.audio_sampling_rate as f64
    };
    let start = seconds(&index * factor);
    let end = seconds((index + 1.0) * factor);
    Tensor::stack(&[start, end], -1).unsqueeze(0).unsqueeze(0).expand([batch, 1, -1, -1], false)
}

/// The table of `width` channels for `coords` (B, P, S, 2) over the first P ranges of `max`.
fn table(c: &Ltx2TransformerConfig, coords: &Tensor, max: &[f64], width: i64, heads: i64) -> Rope {
    let size = coords.size();
    let (batch, positions, tokens) = (size[0], size[1], size[2]);
    let bounds = coords.chunk(2, -1);
    let centres = ((&bounds[0] + &bounds[1]) / 2.0).squeeze_dim(-1);
    let fractions: Vec<Tensor> =
        (0..positions).map(|i| centres.select(1, i) / max[i as usize]).collect();
    let grid = Tensor::stack(&fractions, -1);

    let count = width / (2 * positions);
    let exact = if c.rope_double_precision { Kind::Double } else { Kind::Float };
    let exponents = Tensor::linspace(0.0, 1.0, count, (exact, coords.device()));
    let frequencies =
        (Tensor::pow_scalar(c.rope_theta, &exponents) * PI / 2.0).to_kind(Kind::Float);
    let angles = (grid.unsqueeze(-1) * 2.0 - 1.0) * frequencies;
    let angles = angles.transpose(-1, -2).flatten(2, 3);
    let (cos, sin) = (angles.cos(), angles.sin());
    // Channels the frequencies do not fill lead, unturned (cos 1, sin 0).
    let pad = |t: Tensor, fill: f64, missing: i64| {
        let lead = Tensor::full([batch, tokens, missing], fill, (Kind::Float, coords.device()));
        Tensor::cat(&[lead, t], -1)
    };
    if c.split_rope() {
        let missing = width / 2 - angles.size()[2];
        let group = |t: Tensor, fill| pad(t, fill, missing).view([batch, tokens, heads, -1]);
        Rope { cos: group(cos, 1.0), sin: group(sin, 0.0), split: true }
    } else {
        let missing = width % (2 * positions);
        let pairs = |t: Tensor, fill| pad(t.repeat_interleave_self_int(2, -1, None), fill, missing);
        Rope { cos: pairs(cos, 1.0), sin: pairs(sin, 0.0), split: false }
    }
}
