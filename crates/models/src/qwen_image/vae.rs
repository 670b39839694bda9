//! `AutoencoderKLQwenImage`: the Wan-style causal 3-D VAE of Qwen-Image. Pictures are one-frame
//! videos; video is encoded in chunks of 1, 4, 4, … frames and decoded one latent frame at a time,
//! each causal convolution continuing from the frames the previous chunk ended with, as diffusers
//! does. Latents seen by the denoiser are `(z − latents_mean) / latents_std`.
//!
//! Not ported: diffusers' tiled encode/decode (`enable_tiling`) and batch slicing.

mod blocks;
mod config;
mod layers;
mod tiny;

use std::path::Path;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::nn::Scope;
use crate::vae::AutoencoderKl;
use crate::weights::{checkpoint_files, load_weights, LoadOptions};
use crate::{read_config, ModelError};
use blocks::{Decoder, Encoder};
pub use config::QwenVaeConfig;
use layers::{CausalConv3d, FrameCache};
pub use tiny::write_tiny_qwen_vae;

/// Frames per encoder chunk after the first (diffusers' fixed 1 + 4 + 4 + … split).
const ENCODER_CHUNK: i64 = 4;

/// The VAE: `encoder`, `quant_conv`, `post_quant_conv` and `decoder` below the store's root, named
/// like the checkpoint keys.
pub struct AutoencoderKlQwenImage {
    pub config: QwenVaeConfig,
    encoder: Encoder,
    quant_conv: CausalConv3d,
    post_quant_conv: CausalConv3d,
    decoder: Decoder,
    pub store: VarStore,
}

impl AutoencoderKlQwenImage {
    /// The module tree of `config` with zero weights.
    pub fn new(config: &QwenVaeConfig, device: Device) -> Result<Self, ModelError> {
        config.validate().map_err(ModelError::Input)?;
        let store = VarStore::new(device);
        let root = Scope::root(store.root(), None);
        let z = config.z_dim;
        Ok(Self {
            config: config.clone(),
            encoder: Encoder::new(&(&root / "encoder"), config),
            quant_conv: CausalConv3d::new(&(&root / "quant_conv"), 2 * z, 2 * z, [1; 3], [1; 3]),
            post_quant_conv: CausalConv3d::new(&(&root / "post_quant_conv"), z, z, [1; 3], [1; 3]),
            decoder: Decoder::new(&(&root / "decoder"), config),
            store,
        })
    }

    /// Loads a diffusers `vae/` directory, frozen.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let path = dir.join("config.json");
        let config: QwenVaeConfig = read_config(&path)?;
        config
            .validate()
            .map_err(|message| ModelError::Format { path: path.display().to_string(), message })?;
        let mut model = Self::new(&config, device)?;
        load_weights(
            &mut model.store,
            &checkpoint_files(dir)?,
            LoadOptions { kind: Some(kind), ..Default::default() },
        )?;
        model.store.freeze();
        Ok(model)
    }

    /// `latents_mean` and `latents_std` as (1, z, 1, 1, 1) tensors like `like`.
    fn stats(&self, like: &Tensor) -> (Tensor, Tensor) {
        let shape = [1, self.config.z_dim, 1, 1, 1];
        let t = |v: &[f64]| {
            Tensor::from_slice(v).to_kind(like.kind()).to_device(like.device()).view(shape)
        };
        (t(&self.config.latents_mean), t(&self.config.latents_std))
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
        let x = self.post_quant_conv.forward(&(latents * std + mean), None);
        let frames = x.size()[2];
        let mut cache = FrameCache::new();
        let out: Vec<Tensor> = (0..frames)
            .map(|i| {
                cache.start_chunk(i + 1 == frames);
                self.decoder.forward(&x.narrow(2, i, 1), &mut cache)
            })
            .collect();
        Tensor::cat(&out, 2).clamp(-1.0, 1.0)
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
        let video = video.to_kind(self.encoder_kind());
        let chunks = 1 + (video.size()[2] - 1) / ENCODER_CHUNK;
        let mut cache = FrameCache::new();
        let out: Vec<Tensor> = (0..chunks)
            .map(|i| {
                cache.start_chunk(i + 1 == chunks);
                let (start, len) = if i == 0 { (0, 1) } else { (1 + ENCODER_CHUNK * (i - 1), 4) };
                self.encoder.forward(&video.narrow(2, start, len), &mut cache)
            })
            .collect();
        let moments = self.quant_conv.forward(&Tensor::cat(&out, 2), None);
        let [mean, logvar]: [Tensor; 2] = moments.chunk(2, 1).try_into().expect("two halves");
        let (latents_mean, latents_std) = self.stats(&mean);
        ((mean - latents_mean) / latents_std, logvar.clamp(-30.0, 20.0))
    }

    /// The dtype of the decoder weights (latents are cast to it).
    pub fn decoder_kind(&self) -> Kind {
        self.post_quant_conv.kind()
    }

    /// The dtype of the encoder weights (pictures are cast to it).
    pub fn encoder_kind(&self) -> Kind {
        self.quant_conv.kind()
    }

    /// Decoded images as u8 RGB (B, H, W, 3), as [`AutoencoderKl::to_rgb8`].
    pub fn to_rgb8(images: &Tensor) -> Tensor {
        AutoencoderKl::to_rgb8(images)
    }
}
