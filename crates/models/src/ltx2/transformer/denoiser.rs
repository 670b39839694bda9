//! The LTX-2 transformer as flowtune's [`Denoiser`] on the joint latent of
//! [`crate::ltx2::latents`] (B, S_v + S_a, C): the packed video tokens, then the audio tokens,
//! and the velocities in the same layout.

use tch::{Device, Kind, Tensor};

use super::model::{Ltx2Inputs, Ltx2Transformer};
use crate::denoiser::{weights_and_frozen_copy, ExampleInputs, ExampleShape, TrainableDenoiser};
use crate::ltx2::latents::{join, split};
use crate::sequence::SequenceParallel;
use crate::{generated_frames, hold_frames, Denoiser, ModelError, TextConditioning};

/// Extra (B, L, D_a): the audio connector's text states ([`TextConditioning::embeds`] holds the
/// video's).
pub const AUDIO_EMBEDS: &str = "audio_embeds";
/// Extra (B, 3) int64: each row's latent video (frames, height, width); equal for every row.
pub const VIDEO_SHAPE: &str = "video_shape";
/// Extra (B,) float: the frame rate the positions are conditioned on.
pub const FPS: &str = "fps";

impl Ltx2Transformer {
    /// The latent video shape every row of `text` names ([`VIDEO_SHAPE`]), read to the host.
    fn video_shape(&self, text: &TextConditioning) -> Result<[i64; 3], ModelError> {
        let shapes = extra(text, VIDEO_SHAPE)?;
        let values =
            Vec::<i64>::try_from(shapes.to_kind(Kind::Int64).to_device(Device::Cpu).reshape([-1]))
                .map_err(|e| ModelError::Input(format!("{VIDEO_SHAPE}: {e}")))?;
        let first: [i64; 3] = values
            .get(..3)
            .and_then(|v| v.try_into().ok())
            .filter(|_| shapes.size() == [text.embeds.size()[0], 3])
            .ok_or_else(|| {
                ModelError::Input(format!(
                    "{VIDEO_SHAPE} has shape {:?}, expected [B, 3]",
                    shapes.size()
                ))
            })?;
        if values.chunks(3).any(|row| row != first) {
            return Err(ModelError::Input(format!(
                "{VIDEO_SHAPE} differs between rows ({values:?}): one batch holds videos of one shape"
            )));
        }
        Ok(first)
    }
}

fn extra<'a>(text: &'a TextConditioning, name: &str) -> Result<&'a Tensor, ModelError> {
    text.extras
        .get(name)
        .ok_or_else(|| ModelError::Input(format!("LTX-2 conditioning has no `{name}`")))
}

impl Denoiser for Ltx2Transformer {
    /// LTX2Pipeline passes the scheduler's timestep `1000·σ` and reads velocities: the forward
    /// on the joint latent's video and audio parts, concatenated back. With held latents
    /// (image-to-video: the first frame's tokens), those tokens are set to the condition at
    /// timestep 0, as LTX2ImageToVideoPipeline runs them, and get no velocity (they are not
    /// sampled).
    fn velocity(
        &self,
        latents: &Tensor,
        timestep: &Tensor,
        text: &TextConditioning,
    ) -> Result<Tensor, ModelError> {
        let video_shape = self.video_shape(text)?;
        let video_tokens = self.video_tokens(video_shape);
        let held = text.held_latents();
        let (latents, generated) = match held {
            Some(h) => {
                self.check_held(latents, h, video_tokens)?;
                (hold_frames(latents, h), Some(generated_frames(latents, h)))
            }
            None => (latents.shallow_clone(), None),
        };
        // 0 on the held tokens, the step's timestep on the others: (B, S_v).
        let video_timestep = generated.as_ref().map(|g| {
            timestep.to_kind(Kind::Float).view([-1, 1])
                * g.narrow(1, 0, video_tokens).view([1, -1]).to_kind(Kind::Float)
        });
        let (video, audio) = split(&latents, video_tokens)?;
        let (v, a) = self.forward(&Ltx2Inputs {
            video: &video,
            audio: &audio,
            video_text: &text.embeds,
            audio_text: extra(text, AUDIO_EMBEDS)?,
            text_mask: text.mask.as_ref(),
            timestep,
            video_timestep: video_timestep.as_ref(),
            video_shape,
            fps: extra(text, FPS)?,
        })?;
        let v = join(&v, &a).to_kind(latents.kind());
        Ok(match generated {
            Some(g) => v * g,
            None => v,
        })
    }
}

impl Ltx2Transformer {
    /// Held latents (B, Sh, C) must be leading video tokens of `latents` (B, S_v + S_a, C).
    fn check_held(
        &self,
        latents: &Tensor,
        held: &Tensor,
        video_tokens: i64,
    ) -> Result<(), ModelError> {
        let (size, h) = (latents.size(), held.size());
        let fits = size.len() == 3
            && h.len() == 3
            && (h[0], h[2]) == (size[0], size[2])
            && (1..video_tokens).contains(&h[1]);
        if fits {
            return Ok(());
        }
        Err(ModelError::Input(format!(
            "LTX-2 held latents {h:?} do not fit latents {size:?}: expected [B, Sh, C] with \
             0 < Sh < {video_tokens} video tokens"
        )))
    }
}

impl TrainableDenoiser for Ltx2Transformer {
    weights_and_frozen_copy!();

    /// Both token streams split: video and audio self-attention and the audio↔video attentions
    /// (queries of one stream, keys of the other) through Ulysses; text cross-attention stays
    /// local. Refuses a group size that does not divide the video or the audio heads.
    fn sequence_parallel(&self, group: SequenceParallel) -> Result<(), ModelError> {
        let c = &self.config;
        let s = group.size() as i64;
        for (key, heads) in [
            ("num_attention_heads", c.num_attention_heads),
            ("audio_num_attention_heads", c.audio_num_attention_heads),
        ] {
            if heads % s != 0 {
                return Err(ModelError::Input(format!(
                    "trainer.sequence_parallel_size {s} does not divide the LTX-2 transformer's \
                     {key} {heads}"
                )));
            }
        }
        self.weights.sequence_parallel("LTX-2", c.num_attention_heads, group)
    }

    /// A latent video of `frames` × `height` × `width` cells (rounded up to whole patches) at
    /// 24 fps with 8 audio latent frames per video latent frame (LTX-2's ratio), all text tokens
    /// valid.
    fn example_inputs(&self, shape: ExampleShape) -> ExampleInputs {
        let ExampleShape { batch, frames, height, width, text_len } = shape;
        let c = &self.config;
        let device = self.weights.base.device();
        let opts = (self.proj_in.weight.kind(), device);
        let whole = |n: i64, p: i64| (n.max(1) + p - 1) / p * p;
        let video_shape = [
            whole(frames, c.patch_size_t),
            whole(height, c.patch_size),
            whole(width, c.patch_size),
        ];
        let tokens = self.video_tokens(video_shape) + 8 * video_shape[0];
        let mut text =
            TextConditioning::new(Tensor::randn([batch, text_len, c.video_text_dim()], opts), None);
        text.mask = Some(Tensor::ones([batch, text_len], (Kind::Int64, device)));
        let extras = [
            (AUDIO_EMBEDS, Tensor::randn([batch, text_len, c.audio_text_dim()], opts)),
            (VIDEO_SHAPE, Tensor::from_slice(&video_shape).to_device(device).repeat([batch, 1])),
            (FPS, Tensor::full([batch], 24.0, (Kind::Float, device))),
        ];
        text.extras.extend(extras.into_iter().map(|(k, v)| (k.to_string(), v)));
        ExampleInputs {
            latents: Tensor::randn([batch, tokens, c.in_channels], opts),
            timestep: Tensor::full([batch], 500.0, (Kind::Float, device)),
            text,
            tokens: batch * tokens,
        }
    }

    fn describe(&self) -> String {
        format!(
            "LTX-2 transformer {} layers × {} video / {} audio dim",
            self.config.num_layers,
            self.config.inner_dim(),
            self.config.audio_inner_dim()
        )
    }
}
