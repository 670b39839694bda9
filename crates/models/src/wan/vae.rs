//! `AutoencoderKLWan`: the causal video VAE of Wan2.1 (z 16, 8× spatial) and Wan2.2 (residual
//! blocks, 2×2 pixel patches folded into channels, z 48, 16× spatial), both 4× temporal: 1 + 4k
//! frames ↔ 1 + k latent frames ([`crate::causal_vae`]). Latents seen by the denoiser are
//! `(z − latents_mean) / latents_std`, as WanPipeline denormalises them before decoding.

use std::path::Path;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::vae_config::WanVaeConfig;
use crate::causal_vae::{channel_stats, write_random_vae, CausalVae};
use crate::ModelError;

/// The VAE: `encoder`, `quant_conv`, `post_quant_conv` and `decoder` below the store's root.
pub struct AutoencoderKlWan {
    pub config: WanVaeConfig,
    vae: CausalVae,
    pub store: VarStore,
}

impl AutoencoderKlWan {
    /// The module tree of `config` for `kind` weights, unfilled.
    pub fn new(config: &WanVaeConfig, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let (vae, store) = CausalVae::build(config, device, kind)?;
        Ok(Self { config: config.clone(), vae, store })
    }

    /// Loads a diffusers `vae/` directory, frozen.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let (config, vae, store) = CausalVae::load(dir, device, kind)?;
        Ok(Self { config, vae, store })
    }

    /// Writes a random VAE of `config` (weights drawn from `seed`) into `dir`, for tests.
    pub fn write_random(dir: &Path, seed: u64, config: &WanVaeConfig) -> Result<(), ModelError> {
        let vae = Self::new(config, Device::Cpu, Kind::Float)?;
        write_random_vae(dir, &vae.store, seed, config, "AutoencoderKLWan")
    }

    /// Video in [−1, 1] (B, 3, T, H, W) from the denoiser's latents (B, z, F, h, w):
    /// `decode(latents · std + mean)`, T = 1 + 4(F − 1) for the released configs.
    pub fn decode_video(&self, latents: &Tensor) -> Result<Tensor, ModelError> {
        let c = &self.config;
        let size = latents.size();
        if size.len() != 5 || size[1] != c.z_dim {
            return Err(ModelError::Input(format!(
                "Wan VAE latents have shape {size:?}, expected [B, {}, F, h, w]",
                c.z_dim
            )));
        }
        let latents = latents.to_kind(self.vae.decoder_kind());
        let (mean, std) =
            (channel_stats(&c.latents_mean, &latents), channel_stats(&c.latents_std, &latents));
        let out = self.vae.decode(&(latents * std + mean));
        Ok(unpatchify(&out, c.patch()).clamp(-1.0, 1.0))
    }

    /// Latents of video in [−1, 1] (B, 3, T, H, W), H and W multiples of the spatial factor: the
    /// posterior mean normalised, `(mean − latents_mean) / latents_std` (what the image-to-video
    /// pipelines condition on), and the raw posterior log-variance, both (B, z, F, h, w).
    pub fn encode_video(&self, video: &Tensor) -> Result<(Tensor, Tensor), ModelError> {
        let c = &self.config;
        let size = video.size();
        let f = c.spatial_factor();
        if size.len() != 5 || size[1] != c.pixel_channels() || size[3] % f != 0 || size[4] % f != 0
        {
            return Err(ModelError::Input(format!(
                "Wan VAE video has shape {size:?}, expected [B, {}, T, H, W] with H and W \
                 multiples of {f}",
                c.pixel_channels()
            )));
        }
        let (mean, logvar) = self.vae.encode(&patchify(video, c.patch()));
        let (lm, ls) =
            (channel_stats(&c.latents_mean, &mean), channel_stats(&c.latents_std, &mean));
        Ok(((mean - lm) / ls, logvar))
    }

    /// The dtype of the encoder weights (video is cast to it).
    pub fn encoder_kind(&self) -> Kind {
        self.vae.encoder_kind()
    }

    /// Pictures (B, 3, H, W) from one-frame latents (B, z, h, w).
    pub fn decode(&self, latents: &Tensor) -> Result<Tensor, ModelError> {
        Ok(self.decode_video(&latents.unsqueeze(2))?.squeeze_dim(2))
    }

    /// As [`Self::encode_video`] for pictures (B, 3, H, W).
    pub fn encode(&self, images: &Tensor) -> Result<(Tensor, Tensor), ModelError> {
        let (mean, logvar) = self.encode_video(&images.unsqueeze(2))?;
        Ok((mean.squeeze_dim(2), logvar.squeeze_dim(2)))
    }
}

/// diffusers' `patchify`: (B, C, T, H, W) → (B, C·p², T, H/p, W/p), channel `c·p² + j·p + i` the
/// pixel at column offset j and row offset i of each patch.
fn patchify(x: &Tensor, p: i64) -> Tensor {
    if p == 1 {
        return x.shallow_clone();
    }
    let (b, c, t, h, w) = x.size5().expect("checked 5-d");
    x.reshape([b, c, t, h / p, p, w / p, p]).permute([0, 1, 6, 4, 2, 3, 5]).reshape([
        b,
        c * p * p,
        t,
        h / p,
        w / p,
    ])
}

/// The inverse of [`patchify`].
fn unpatchify(x: &Tensor, p: i64) -> Tensor {
    if p == 1 {
        return x.shallow_clone();
    }
    let (b, cp, t, h, w) = x.size5().expect("5-d decoder output");
    x.reshape([b, cp / (p * p), p, p, t, h, w]).permute([0, 1, 4, 5, 3, 6, 2]).reshape([
        b,
        cp / (p * p),
        t,
        h * p,
        w * p,
    ])
}
