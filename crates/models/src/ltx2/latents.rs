//! LTX-2's joint latent: the video's packed patch tokens followed by the audio's packed frames,
//! one (B, S_v + S_a, C) tensor that rollouts step with one SDE, as `LTX2Pipeline` steps its two
//! latents with one sigma grid. Packing follows the pipeline's `_pack_latents` (video patches
//! `C·pt·p·p` wide) and `_pack_audio_latents` without patching (each audio frame's channels and
//! mel bins, `C_a·M` wide: [`super::audio_vae::pack_latents`]); both widths are the transformer's
//! `in_channels`.

use tch::Tensor;

use crate::ModelError;

/// The geometry of one sample: latent video cells, audio latent frames and the frame rate the
/// positions are conditioned on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Geometry {
    /// Latent frames, rows and columns of the video (before the transformer's patching).
    pub frames: i64,
    pub height: i64,
    pub width: i64,
    /// Audio latent frames (one token each).
    pub audio_frames: i64,
    /// Frame rate of the video's positions (`frame_rate / motion_speed`).
    pub fps: f64,
}

/// What turns pixels and seconds into latent sizes: the VAEs' compression and the audio's rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Compression {
    pub spatial: i64,
    pub temporal: i64,
    /// Audio samples per second and per mel frame.
    pub sample_rate: i64,
    pub hop_length: i64,
    /// Mel frames per audio latent frame.
    pub audio_temporal: i64,
}

impl Compression {
    /// The latent geometry of `num_frames` pixel frames of `height` × `width` at `frame_rate`,
    /// as `LTX2Pipeline.__call__` sizes its latents: `(n − 1)/t + 1` latent frames and
    /// `round(n / fps · rate / hop / t_a)` audio frames (Python's round: half to even).
    pub fn geometry(
        &self,
        num_frames: i64,
        height: i64,
        width: i64,
        frame_rate: f64,
    ) -> Result<Geometry, ModelError> {
        for (side, name) in [(height, "height"), (width, "width")] {
            if side <= 0 || side % self.spatial != 0 {
                return Err(ModelError::Input(format!(
                    "{name} {side}: LTX-2 needs a positive multiple of {} pixels (the video VAE's \
                     spatial compression)",
                    self.spatial
                )));
            }
        }
        if num_frames < 1 || (num_frames - 1) % self.temporal != 0 {
            return Err(ModelError::Input(format!(
                "num_frames {num_frames}: LTX-2 takes 1 + {t}·k frames (9, 17, …, 121; the video \
                 VAE's temporal compression {t})",
                t = self.temporal
            )));
        }
        if !(frame_rate.is_finite() && frame_rate > 0.0) {
            return Err(ModelError::Input(format!("frame_rate must be > 0, got {frame_rate}")));
        }
        let per_second =
            self.sample_rate as f64 / self.hop_length as f64 / self.audio_temporal as f64;
        let audio_frames = (num_frames as f64 / frame_rate * per_second).round_ties_even() as i64;
        if audio_frames < 1 {
            return Err(ModelError::Input(format!(
                "{num_frames} frames at {frame_rate} fps hold no audio latent frame"
            )));
        }
        Ok(Geometry {
            frames: (num_frames - 1) / self.temporal + 1,
            height: height / self.spatial,
            width: width / self.spatial,
            audio_frames,
            fps: frame_rate,
        })
    }
}

/// The transformer's patch sizes (`patch_size_t`, `patch_size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Patches {
    pub temporal: i64,
    pub spatial: i64,
}

impl Patches {
    /// Video tokens of `g`.
    pub fn video_tokens(&self, g: &Geometry) -> i64 {
        (g.frames / self.temporal) * (g.height / self.spatial) * (g.width / self.spatial)
    }

    /// (B, C, F, H, W) → (B, F'·H'·W', C·pt·p·p), the pipeline's `_pack_latents`.
    pub fn pack_video(&self, latents: &Tensor) -> Tensor {
        let s = latents.size();
        let (pt, p) = (self.temporal, self.spatial);
        latents
            .reshape([s[0], s[1], s[2] / pt, pt, s[3] / p, p, s[4] / p, p])
            .permute([0, 2, 4, 6, 1, 3, 5, 7])
            .flatten(4, 7)
            .flatten(1, 3)
    }

    /// The inverse of [`Self::pack_video`] for `g`'s latent cells.
    pub fn unpack_video(&self, tokens: &Tensor, g: &Geometry) -> Tensor {
        let (pt, p) = (self.temporal, self.spatial);
        let b = tokens.size()[0];
        tokens
            .reshape([b, g.frames / pt, g.height / p, g.width / p, -1, pt, p, p])
            .permute([0, 4, 1, 5, 2, 6, 3, 7])
            .flatten(6, 7)
            .flatten(4, 5)
            .flatten(2, 3)
    }
}

/// The video tokens and the audio tokens of a joint latent (B, S_v + S_a, C).
pub fn split(joint: &Tensor, video_tokens: i64) -> Result<(Tensor, Tensor), ModelError> {
    let s = joint.size();
    if s.len() != 3 || s[1] <= video_tokens {
        return Err(ModelError::Input(format!(
            "an LTX-2 latent is (batch, video + audio tokens, channels) with more than \
             {video_tokens} video tokens; got {s:?}"
        )));
    }
    Ok((joint.narrow(1, 0, video_tokens), joint.narrow(1, video_tokens, s[1] - video_tokens)))
}

/// The joint latent of packed video and audio tokens.
pub fn join(video: &Tensor, audio: &Tensor) -> Tensor {
    Tensor::cat(&[video, audio], 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ltx2::audio_vae::{pack_latents, unpack_latents};
    use tch::{Device, Kind};

    const LTX2: Compression = Compression {
        spatial: 32,
        temporal: 8,
        sample_rate: 16000,
        hop_length: 160,
        audio_temporal: 4,
    };

    #[test]
    fn the_pipeline_default_clip_has_its_latent_sizes() {
        // 121 frames of 512 × 768 at 24 fps: 16 latent frames of 16 × 24 cells and
        // round(121/24 · 25) = round(126.04) = 126 audio frames.
        let g = LTX2.geometry(121, 512, 768, 24.0).unwrap();
        assert_eq!((g.frames, g.height, g.width, g.audio_frames), (16, 16, 24, 126));
        // 1 frame at 2 fps: 0.5 s · 25 = 12.5 → 12 (half to even).
        assert_eq!(LTX2.geometry(1, 32, 32, 2.0).unwrap().audio_frames, 12);
    }

    #[test]
    fn sizes_the_vae_cannot_take_are_refused_by_name() {
        let err = LTX2.geometry(120, 512, 768, 24.0).unwrap_err().to_string();
        assert!(err.contains("num_frames 120"), "{err}");
        let err = LTX2.geometry(121, 500, 768, 24.0).unwrap_err().to_string();
        assert!(err.contains("height 500"), "{err}");
    }

    #[test]
    fn packing_puts_each_patch_in_one_token_and_unpacks_back() {
        let patches = Patches { temporal: 1, spatial: 2 };
        let g = Geometry { frames: 2, height: 4, width: 6, audio_frames: 3, fps: 24.0 };
        let video =
            Tensor::arange(2 * 3 * 2 * 4 * 6, (Kind::Float, Device::Cpu)).reshape([2, 3, 2, 4, 6]);
        let tokens = patches.pack_video(&video);
        assert_eq!(tokens.size(), [2, patches.video_tokens(&g), 12]);
        // Token (frame 1, row 1, column 2) of sample 1, feature (channel 2, dy 1, dx 0).
        let token = 6 + 3 + 2;
        let want = video.double_value(&[1, 2, 1, 3, 4]);
        assert_eq!(tokens.double_value(&[1, token, 2 * 4 + 2]), want);
        assert!(patches.unpack_video(&tokens, &g).equal(&video));

        let audio = Tensor::randn([2, 4, 3, 5], (Kind::Float, Device::Cpu));
        let packed = pack_latents(&audio).unwrap();
        assert_eq!(packed.size(), [2, 3, 20]);
        assert_eq!(packed.double_value(&[1, 2, 7]), audio.double_value(&[1, 1, 2, 2]));
        assert!(unpack_latents(&packed, 5).unwrap().equal(&audio));

        let (v, a) = split(&join(&tokens, &packed.narrow(2, 0, 12)), 12).unwrap();
        assert!(v.equal(&tokens) && a.size() == [2, 3, 12]);
        assert!(split(&tokens, 12).is_err());
    }
}
