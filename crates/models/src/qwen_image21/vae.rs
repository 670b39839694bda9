//! `AutoencoderKLQwenImage21`: Wan2.2's residual VAE layout ([`crate::causal_vae`], `is_residual`)
//! specialised to pictures, every causal convolution a 2-D one, 64 latent channels at 16×
//! downsampling, RGBA in and out by default. Latents seen by the denoiser are
//! `(z − latents_mean) / latents_std`.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::causal_vae::{channel_stats, check_stats, write_random_vae, CausalVae, VaeLayout};
use crate::ModelError;

/// `AutoencoderKLQwenImage21` config, with diffusers' field names and defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct QwenImage21VaeConfig {
    #[serde(rename = "_class_name", skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
    pub base_dim: i64,
    pub decoder_base_dim: Option<i64>,
    pub z_dim: i64,
    pub dim_mult: Vec<i64>,
    pub num_res_blocks: usize,
    pub attn_scales: Vec<f64>,
    pub temperal_downsample: Vec<bool>,
    /// Training-only; inference ignores it.
    pub dropout: f64,
    pub latents_mean: Vec<f64>,
    pub latents_std: Vec<f64>,
    pub is_residual: bool,
    /// Picture channels read and written (4: RGBA).
    pub in_channels: i64,
    pub out_channels: i64,
    /// Pixel patchifying before the encoder (not supported: the released VAE has none).
    pub patch_size: Option<i64>,
    pub scale_factor_temporal: Option<i64>,
    pub scale_factor_spatial: Option<i64>,
}

impl Default for QwenImage21VaeConfig {
    fn default() -> Self {
        Self {
            class_name: Some("AutoencoderKLQwenImage21".into()),
            base_dim: 96,
            decoder_base_dim: Some(144),
            z_dim: 64,
            dim_mult: vec![1, 2, 4, 8, 8],
            num_res_blocks: 2,
            attn_scales: vec![],
            temperal_downsample: vec![false, true, true, true],
            dropout: 0.0,
            latents_mean: LATENTS_MEAN.to_vec(),
            latents_std: LATENTS_STD.to_vec(),
            is_residual: true,
            in_channels: 4,
            out_channels: 4,
            patch_size: None,
            scale_factor_temporal: Some(8),
            scale_factor_spatial: Some(16),
        }
    }
}

impl QwenImage21VaeConfig {
    /// Spatial downsampling factor of the latents: 2^(levels − 1).
    pub fn spatial_factor(&self) -> i64 {
        1 << (self.dim_mult.len().max(1) - 1)
    }

    /// The architecture: 2-D convolutions throughout.
    pub(crate) fn layout(&self) -> VaeLayout {
        VaeLayout {
            base_dim: self.base_dim,
            decoder_base_dim: self.decoder_base_dim.unwrap_or(self.base_dim),
            z_dim: self.z_dim,
            dim_mult: self.dim_mult.clone(),
            num_res_blocks: self.num_res_blocks,
            attn_scales: self.attn_scales.clone(),
            temperal_downsample: self.temperal_downsample.clone(),
            in_channels: self.in_channels,
            out_channels: self.out_channels,
            is_residual: self.is_residual,
            time: false,
        }
    }

    /// Checks the combinations diffusers would reject or flowtune does not run.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(p) = self.patch_size.filter(|&p| p != 1) {
            return Err(format!("patch_size {p} is not supported (no patchifying VAE)"));
        }
        if !(3..=4).contains(&self.in_channels) || !(3..=4).contains(&self.out_channels) {
            return Err(format!(
                "in_channels {} / out_channels {}: expected RGB (3) or RGBA (4) pictures",
                self.in_channels, self.out_channels
            ));
        }
        self.layout().validate()?;
        check_stats(self.z_dim, &self.latents_mean, &self.latents_std)
    }

    /// The real layout (five levels, residual blocks, 16× downsampling, RGBA) at widths 8 and
    /// 12 with `z_dim` latent channels and made-up statistics.
    pub fn tiny(z_dim: i64) -> Self {
        Self {
            base_dim: 8,
            decoder_base_dim: Some(12),
            z_dim,
            num_res_blocks: 1,
            latents_mean: (0..z_dim).map(|i| 0.1 * (i % 7) as f64 - 0.3).collect(),
            latents_std: (0..z_dim).map(|i| 1.0 + 0.25 * (i % 5) as f64).collect(),
            ..Default::default()
        }
    }
}

impl crate::causal_vae::CausalVaeConfig for QwenImage21VaeConfig {
    fn check(&self) -> Result<(), String> {
        self.validate()
    }

    fn vae_layout(&self) -> VaeLayout {
        self.layout()
    }
}

/// The VAE: `encoder`, `quant_conv`, `post_quant_conv` and `decoder` below the store's root.
pub struct AutoencoderKlQwenImage21 {
    pub config: QwenImage21VaeConfig,
    vae: CausalVae,
    pub store: VarStore,
}

impl AutoencoderKlQwenImage21 {
    /// The module tree of `config` for `kind` weights, unfilled.
    pub fn new(
        config: &QwenImage21VaeConfig,
        device: Device,
        kind: Kind,
    ) -> Result<Self, ModelError> {
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

    /// Pictures in [−1, 1] (B, out_channels, f·H, f·W) from the denoiser's latents
    /// (B, z, H, W): `decode(latents · std + mean)`, clamped.
    pub fn decode(&self, latents: &Tensor) -> Tensor {
        let latents = latents.to_kind(self.vae.decoder_kind()).unsqueeze(2);
        let (mean, std) = self.stats(&latents);
        self.vae.decode(&(latents * std + mean)).squeeze_dim(2).clamp(-1.0, 1.0)
    }

    /// Latents (B, z, H/f, W/f) of pictures in [−1, 1] (B, in_channels, H, W): the posterior
    /// mean, `(mean − latents_mean) / latents_std`, as `_encode_vae_image` returns it.
    pub fn encode(&self, pictures: &Tensor) -> Tensor {
        let (mean, _) = self.vae.encode(&pictures.to_kind(self.vae.encoder_kind()).unsqueeze(2));
        let (latents_mean, latents_std) = self.stats(&mean);
        ((mean - latents_mean) / latents_std).squeeze_dim(2)
    }

    /// The dtype of the decoder weights.
    pub fn decoder_kind(&self) -> Kind {
        self.vae.decoder_kind()
    }
}

/// Writes `config.json` and `diffusion_pytorch_model.safetensors` of a random VAE into `dir`.
pub fn write_tiny_qwen_image21_vae(
    dir: &Path,
    seed: u64,
    config: &QwenImage21VaeConfig,
) -> Result<(), ModelError> {
    let vae = AutoencoderKlQwenImage21::new(config, Device::Cpu, Kind::Float)?;
    write_random_vae(dir, &vae.store, seed, config, "AutoencoderKLQwenImage21")
}

/// The released `latents_mean` (diffusers' default; data, not π/6).
#[allow(clippy::approx_constant)]
const LATENTS_MEAN: [f64; 64] = [
    0.5126, 0.7721, -0.0631, 1.3506, -0.7855, -2.1025, -0.3458, 1.3722, 1.8873, -1.7177, -0.6510,
    0.2732, 0.7562, -0.6163, -1.0277, 3.8363, 2.0210, 0.0472, 0.9320, 2.0087, 2.4954, -0.1391,
    -1.4249, 1.8464, -0.5236, 1.2826, 3.7046, -1.3035, 2.7286, -1.4518, -1.9036, -1.9955, -0.0342,
    -1.0265, -0.7636, 3.0555, 0.0746, -3.0751, -0.1076, 1.7376, -1.0914, -1.9435, -0.2784, -1.3680,
    0.4809, -0.4433, 0.3764, 0.5729, -2.0595, 1.0960, -1.3260, -2.0211, -5.0179, 0.5275, 4.0162,
    1.8505, 0.3026, 1.9373, 1.4937, 0.2632, 0.5547, -1.7121, -0.1562, 0.0304,
];

/// The released `latents_std` (diffusers' default).
const LATENTS_STD: [f64; 64] = [
    3.2001, 3.2936, 3.4321, 3.0091, 3.1061, 4.0379, 4.0705, 3.7910, 3.0785, 3.6500, 3.9308, 3.0904,
    2.8778, 3.7675, 3.7320, 5.0756, 3.2864, 4.0397, 3.1317, 4.0443, 2.9249, 3.9454, 3.0988, 4.2489,
    3.4896, 3.8513, 3.9323, 3.4719, 3.7498, 4.2830, 3.5694, 4.2467, 3.9037, 3.2947, 5.0770, 3.5075,
    3.2700, 3.4767, 2.8063, 5.1125, 3.5327, 4.7833, 3.1286, 4.1819, 3.8527, 3.8312, 3.5605, 4.3875,
    3.9624, 4.0168, 3.5643, 4.0550, 5.5614, 4.2963, 4.4080, 3.4959, 3.8747, 3.7608, 3.5735, 3.1490,
    3.7662, 3.6746, 3.4563, 3.8161,
];
