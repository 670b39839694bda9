//! `AutoencoderKLQwenImage`: Wan2.1's causal 3-D VAE ([`crate::causal_vae`]) under Qwen-Image's
//! class name. Pictures are one-frame videos. Latents seen by the denoiser are
//! `(z − latents_mean) / latents_std`.

mod config;
mod tiny;

use std::path::Path;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::causal_vae::{channel_stats, CausalVae};
use crate::vae::AutoencoderKl;
use crate::ModelError;
pub use config::QwenVaeConfig;
pub use tiny::write_tiny_qwen_vae;

/// The VAE: `encoder`, `quant_conv`, `post_quant_conv` and `decoder` below the store's root, named
/// like the checkpoint keys.
pub struct AutoencoderKlQwenImage {
    pub config: QwenVaeConfig,
    vae: CausalVae,
    pub store: VarStore,
}

impl AutoencoderKlQwenImage {
    /// The module tree of `config` for `kind` weights, unfilled.
    pub fn new(config: &QwenVaeConfig, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let (vae, store) = CausalVae::build(config, device, kind)?;
        Ok(Self { config: config.clone(), vae, store })
    }

    /// Loads a diffusers `vae/` directory, frozen.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let (config, vae, store) = CausalVae::load(dir, device, kind)?;
        Ok(Self { config, vae, store })
    }

    /// `latents_mean` and `latents_std` as (1, z, 1, 1, 1) tensors like `like`.
    fn stats(&self, like: &Tensor) -> (Tensor, Tensor) {
        let c = &self.config;
        (channel_stats(&c.latents_mean, like), channel_stats(&c.latents_std, like))
    }

    /// Images in [−1, 1] (B, 3, f·H, f·W), f = 2^(levels − 1) (8 for Qwen-Image), from the
    /// denoiser's latents (B, z, H, W): `decode(latents · std + mean)`.
    pub fn decode(&self, latents: &Tensor) -> Tensor {
        self.decode_video(&latents.unsqueeze(2)).squeeze_dim(2)
    }

    /// Video in [−1, 1] (B, 3, T, f·H, f·W) from latents (B, z, F, H, W); every latent frame after
    /// the first becomes 2^(temporal levels) frames.
    pub fn decode_video(&self, latents: &Tensor) -> Tensor {
        let latents = latents.to_kind(self.decoder_kind());
        let (mean, std) = self.stats(&latents);
        self.vae.decode(&(latents * std + mean)).clamp(-1.0, 1.0)
    }

    /// Latents of images in [−1, 1] (B, 3, H, W): the posterior mean normalised as the edit
    /// pipelines normalise condition latents, `(mean − latents_mean) / latents_std` (what
    /// `retrieve_latents(…, sample_mode="argmax")` returns, normalised), and the posterior
    /// log-variance of the raw latents (clamped to [−30, 20]), both (B, z, H/f, W/f).
    pub fn encode(&self, images: &Tensor) -> (Tensor, Tensor) {
        let (mean, logvar) = self.encode_video(&images.unsqueeze(2));
        (mean.squeeze_dim(2), logvar.squeeze_dim(2))
    }

    /// As [`Self::encode`] for video (B, 3, T, H, W): 1 + 4k frames give 1 + k·4/2^(temporal
    /// levels) latent frames; frames after the last full group of four are ignored, as in
    /// diffusers.
    pub fn encode_video(&self, video: &Tensor) -> (Tensor, Tensor) {
        let (mean, logvar) = self.vae.encode(video);
        let (latents_mean, latents_std) = self.stats(&mean);
        ((mean - latents_mean) / latents_std, logvar)
    }

    /// The dtype of the decoder weights (latents are cast to it).
    pub fn decoder_kind(&self) -> Kind {
        self.vae.decoder_kind()
    }

    /// The dtype of the encoder weights (pictures are cast to it).
    pub fn encoder_kind(&self) -> Kind {
        self.vae.encoder_kind()
    }

    /// Decoded images as u8 RGB (B, H, W, 3), as [`AutoencoderKl::to_rgb8`].
    pub fn to_rgb8(images: &Tensor) -> Tensor {
        AutoencoderKl::to_rgb8(images)
    }
}
