//! `AutoencoderKLLTX2Video`: LTX-2's video VAE. Video (B, 3, 1 + 8k, H, W) in [−1, 1] is folded
//! into 4×4 pixel patches and encoded causally in time to (B, 128, 1 + k, H/32, W/32) for the
//! released layout; the decoder (centred in time for LTX-2.0) maps latents back, optionally
//! modulated by a decode timestep. The denoiser sees `(z − latents_mean) · scaling_factor /
//! latents_std`, with the checkpoint's per-channel buffers.
//!
//! Not ported: tiled and frame-wise encode/decode (memory savers that blend overlapping tiles),
//! batch slicing, and `decoder_inject_noise` (refused).

mod coders;
mod config;
mod layers;

use std::path::Path;

use flowtune_sampling::SampleRng;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::ltx2::audio_vae::load_vae;
use crate::nn::Scope;
use crate::{read_config, ModelError};
use coders::{Decoder, Encoder};
pub use config::{Flags, Ltx2VideoVaeConfig};

/// The VAE: `encoder`, `decoder` and the `latents_mean` / `latents_std` buffers below the
/// store's root.
pub struct AutoencoderKlLtx2Video {
    pub config: Ltx2VideoVaeConfig,
    encoder: Encoder,
    decoder: Decoder,
    latents_mean: Tensor,
    latents_std: Tensor,
    spatial: i64,
    temporal: i64,
    /// The fewest latent rows and columns the padding modes allow.
    encoder_min_side: i64,
    decoder_min_side: i64,
    pub store: VarStore,
}

impl AutoencoderKlLtx2Video {
    /// The module tree of `config` for `kind` weights, unfilled.
    pub fn new(
        config: &Ltx2VideoVaeConfig,
        device: Device,
        kind: Kind,
    ) -> Result<Self, ModelError> {
        let layout = config.layout().map_err(ModelError::Input)?;
        let store = crate::weights::store(device, kind);
        let root = Scope::root(store.root(), None);
        let stats = [config.latent_channels];
        let (space, time) = layout.encoder_factors();
        Ok(Self {
            config: config.clone(),
            encoder: Encoder::new(&(&root / "encoder"), config, &layout),
            decoder: Decoder::new(&(&root / "decoder"), config, &layout),
            latents_mean: root.var("latents_mean", &stats),
            latents_std: root.var("latents_std", &stats),
            spatial: space * config.patch_size,
            temporal: time,
            encoder_min_side: layout.encoder_padding.min_side(),
            decoder_min_side: layout.decoder_padding.min_side(),
            store,
        })
    }

    /// Loads a diffusers `vae/` directory, frozen: every tensor of the checkpoint used, none
    /// missing.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let path = dir.join("config.json");
        let config: Ltx2VideoVaeConfig = read_config(&path)?;
        config
            .layout()
            .map_err(|message| ModelError::Format { path: path.display().to_string(), message })?;
        let mut vae = Self::new(&config, device, kind)?;
        load_vae(&mut vae.store, dir, kind, [&vae.latents_mean, &vae.latents_std])?;
        if crate::random::active_seed().is_some() {
            // Random weights: diffusers' timestep multiplier.
            tch::no_grad(|| {
                for (name, var) in vae.store.variables() {
                    if name.ends_with("timestep_scale_multiplier") {
                        let _ = var.shallow_clone().fill_(1000.0);
                    }
                }
            });
        }
        Ok(vae)
    }

    /// Writes a random VAE of `config` into `dir`, loadable by diffusers: weights drawn from
    /// `seed` (N(0, 1/fan-in); biases N(0, 0.1²); layer-norm scales 1 + N(0, 0.1²)),
    /// latents_mean N(0, 0.5²), latents_std in [0.5, 2), `timestep_scale_multiplier` 1000 as
    /// diffusers initialises it.
    pub fn write_random(
        dir: &Path,
        seed: u64,
        config: &Ltx2VideoVaeConfig,
    ) -> Result<(), ModelError> {
        let vae = Self::new(config, Device::Cpu, Kind::Float)?;
        let mut rng = SampleRng::new(seed);
        let mut vars: Vec<(String, Tensor)> = vae.store.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        tch::no_grad(|| -> Result<(), ModelError> {
            for (name, var) in &vars {
                let size = var.size();
                let noise = rng.normal(&size, Device::Cpu);
                let value = match name.as_str() {
                    "latents_mean" => noise * 0.5,
                    "latents_std" => rng.uniform(&size, Device::Cpu) * 1.5 + 0.5,
                    _ if size.is_empty() => Tensor::from(1000f32),
                    n if n.ends_with("bias") => noise * 0.1,
                    _ if size.len() == 1 => noise * 0.1 + 1.0,
                    _ => noise / (size[1..].iter().product::<i64>() as f64).sqrt(),
                };
                var.shallow_clone().f_copy_(&value)?;
            }
            Ok(())
        })?;
        std::fs::create_dir_all(dir).map_err(|e| ModelError::Io {
            path: dir.display().to_string(),
            message: e.to_string(),
        })?;
        Tensor::write_safetensors(&vars, dir.join("diffusion_pytorch_model.safetensors"))?;
        let mut cfg = serde_json::to_value(config).expect("serialisable config");
        cfg["_class_name"] = serde_json::json!("AutoencoderKLLTX2Video");
        cfg["_diffusers_version"] = serde_json::json!(crate::sd3::tiny::DIFFUSERS_VERSION);
        crate::write_json(&dir.join("config.json"), &cfg)
    }

    /// The posterior mean and log-variance (clamped to [−30, 20], as diffusers'
    /// `DiagonalGaussianDistribution`; one value shared by all channels) of video
    /// (B, in_channels, T, H, W) in [−1, 1], T = 1 + 8k and H, W multiples of 32 for the
    /// released layout: each (B, latent_channels, 1 + k, H/32, W/32). The image-to-video pipeline
    /// conditions on the mean (`argmax`), normalised by [`Self::normalize_latents`].
    pub fn encode(&self, video: &Tensor) -> Result<(Tensor, Tensor), ModelError> {
        let c = &self.config;
        let size = video.size();
        let (s, t) = (self.spatial, self.temporal);
        if size.len() != 5
            || size[1] != c.in_channels
            || size[2] < 1
            || (size[2] - 1) % t != 0
            || size[3] % s != 0
            || size[4] % s != 0
            || size[3] == 0
            || size[4] == 0
        {
            return Err(ModelError::Input(format!(
                "LTX-2 video VAE input has shape {size:?}, expected [B, {}, 1 + {t}k frames, H, W] \
                 with H and W positive multiples of {s}",
                c.in_channels
            )));
        }
        let side = self.encoder_min_side;
        if size[3] / s < side || size[4] / s < side {
            return Err(ModelError::Input(format!(
                "LTX-2 video VAE input {size:?} is {}×{} latent cells; reflect padding \
                 (encoder_spatial_padding_mode) needs at least {side}×{side}",
                size[3] / s,
                size[4] / s
            )));
        }
        let moments = self.encoder.forward(&video.to_kind(self.encoder.kind()));
        let z = c.latent_channels;
        let mean = moments.narrow(1, 0, z);
        let logvar = moments.narrow(1, z, 1).clamp(-30.0, 20.0).expand_as(&mean).contiguous();
        Ok((mean, logvar))
    }

    /// Video (B, out_channels, 1 + 8(F − 1), 32h, 32w) of raw latents (B, latent_channels, F, h,
    /// w), as `vae.decode(latents, timestep)`: not clamped (the pipeline's post-processing clamps
    /// to [−1, 1]). `timestep` (one value, or one per sample) is required exactly when
    /// `timestep_conditioning` is set; LTX2Pipeline passes `decode_timestep` there after mixing
    /// `decode_noise_scale` of noise into the latents.
    pub fn decode(
        &self,
        latents: &Tensor,
        timestep: Option<&Tensor>,
    ) -> Result<Tensor, ModelError> {
        let c = &self.config;
        let size = latents.size();
        if size.len() != 5 || size[1] != c.latent_channels || size[2] < 1 {
            return Err(ModelError::Input(format!(
                "LTX-2 video VAE latents have shape {size:?}, expected [B, {}, F, h, w]",
                c.latent_channels
            )));
        }
        let side = self.decoder_min_side;
        if size[3] < side || size[4] < side {
            return Err(ModelError::Input(format!(
                "LTX-2 video VAE latents {size:?} have fewer than {side}×{side} cells, which \
                 reflect padding (decoder_spatial_padding_mode) needs"
            )));
        }
        let batch = size[0];
        let timestep = match (c.timestep_conditioning, timestep) {
            (true, Some(t)) if t.numel() == 1 || t.size() == [batch] => {
                Some(t.reshape([-1]).expand([batch], false).to_device(latents.device()))
            }
            (true, Some(t)) => {
                return Err(ModelError::Input(format!(
                    "LTX-2 video VAE decode timestep has shape {:?}, expected one value or \
                     [{batch}]",
                    t.size()
                )))
            }
            (true, None) => {
                return Err(ModelError::Input(
                    "LTX-2 video VAE has timestep_conditioning: decode needs a timestep".into(),
                ))
            }
            (false, Some(_)) => {
                return Err(ModelError::Input(
                    "LTX-2 video VAE has no timestep_conditioning: decode takes no timestep".into(),
                ))
            }
            (false, None) => None,
        };
        Ok(self.decoder.forward(&latents.to_kind(self.decoder.kind()), timestep.as_ref()))
    }

    /// `_normalize_latents`: `(z − latents_mean) · scaling_factor / latents_std` per channel of
    /// (B, latent_channels, F, h, w). (The image-to-video pipeline normalises its condition with
    /// scaling factor 1, which the released config also has.)
    pub fn normalize_latents(&self, latents: &Tensor) -> Result<Tensor, ModelError> {
        let (mean, std) = self.stats_for(latents)?;
        Ok((latents - mean) * self.config.scaling_factor / std)
    }

    /// `_denormalize_latents`: `z · latents_std / scaling_factor + latents_mean`.
    pub fn denormalize_latents(&self, latents: &Tensor) -> Result<Tensor, ModelError> {
        let (mean, std) = self.stats_for(latents)?;
        Ok(latents * std / self.config.scaling_factor + mean)
    }

    fn stats_for(&self, latents: &Tensor) -> Result<(Tensor, Tensor), ModelError> {
        let z = self.config.latent_channels;
        if latents.dim() != 5 || latents.size()[1] != z {
            return Err(ModelError::Input(format!(
                "LTX-2 video latents have shape {:?}, expected [B, {z}, F, h, w]",
                latents.size()
            )));
        }
        let like = |t: &Tensor| {
            t.to_kind(latents.kind()).to_device(latents.device()).view([1, z, 1, 1, 1])
        };
        Ok((like(&self.latents_mean), like(&self.latents_std)))
    }

    /// The per-channel mean buffer (`latent_channels` values).
    pub fn latents_mean(&self) -> &Tensor {
        &self.latents_mean
    }

    /// The per-channel deviation buffer.
    pub fn latents_std(&self) -> &Tensor {
        &self.latents_std
    }

    /// `config.scaling_factor`.
    pub fn scaling_factor(&self) -> f64 {
        self.config.scaling_factor
    }

    /// Pixels per latent cell (32 for LTX-2): the config's value, validated against the blocks.
    pub fn spatial_compression_ratio(&self) -> i64 {
        self.spatial
    }

    /// Frames per latent frame after the first (8 for LTX-2), validated likewise.
    pub fn temporal_compression_ratio(&self) -> i64 {
        self.temporal
    }

    /// The dtype of the weights (inputs are cast to it).
    pub fn kind(&self) -> Kind {
        self.decoder.kind()
    }
}
