//! Mirror of `vae/config.json` of `AutoencoderKLWan`.

use serde::{Deserialize, Serialize};

use crate::causal_vae::{check_stats, VaeLayout};

/// `AutoencoderKLWan` config, with diffusers' field names and defaults (Wan2.1's VAE; Wan2.2's
/// sets `is_residual`, `patch_size` 2, z_dim 48 and 12 channels in and out).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WanVaeConfig {
    #[serde(rename = "_class_name", skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
    /// Encoder channels of the first level; level i has `base_dim · dim_mult[i]`.
    pub base_dim: i64,
    /// The decoder's `base_dim` (`None`: `base_dim`).
    pub decoder_base_dim: Option<i64>,
    /// Latent channels.
    pub z_dim: i64,
    pub dim_mult: Vec<i64>,
    pub num_res_blocks: usize,
    /// Encoder scales (1, 1/2, …) whose residual blocks are followed by attention (Wan2.1 layout).
    pub attn_scales: Vec<f64>,
    /// Per downsampling level: whether it also halves time (the decoder mirrors it).
    pub temperal_downsample: Vec<bool>,
    /// Training-only; inference ignores it.
    pub dropout: f64,
    /// Per-channel statistics: the denoiser works on `(z − mean) / std`.
    pub latents_mean: Vec<f64>,
    pub latents_std: Vec<f64>,
    /// Wan2.2's residual down and up blocks.
    pub is_residual: bool,
    /// Channels the encoder reads (after patchifying) and the decoder writes.
    pub in_channels: i64,
    pub out_channels: i64,
    /// Pixels are folded `patch_size × patch_size` into channels before encoding (Wan2.2).
    pub patch_size: Option<i64>,
    /// Frames per latent frame, as the pipeline reads it.
    pub scale_factor_temporal: Option<i64>,
    /// Pixels per latent cell, as the pipeline reads it.
    pub scale_factor_spatial: Option<i64>,
}

impl Default for WanVaeConfig {
    fn default() -> Self {
        Self {
            class_name: Some("AutoencoderKLWan".into()),
            base_dim: 96,
            decoder_base_dim: None,
            z_dim: 16,
            dim_mult: vec![1, 2, 4, 4],
            num_res_blocks: 2,
            attn_scales: vec![],
            temperal_downsample: vec![false, true, true],
            dropout: 0.0,
            latents_mean: vec![
                -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134,
                -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
            ],
            latents_std: vec![
                2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526,
                2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
            ],
            is_residual: false,
            in_channels: 3,
            out_channels: 3,
            patch_size: None,
            scale_factor_temporal: Some(4),
            scale_factor_spatial: Some(8),
        }
    }
}

impl WanVaeConfig {
    /// The pixel patch folded into channels (1 without `patch_size`).
    pub fn patch(&self) -> i64 {
        self.patch_size.unwrap_or(1)
    }

    /// Pixels per latent cell the architecture gives: 2^(levels − 1) · patch.
    pub fn spatial_factor(&self) -> i64 {
        (1 << (self.dim_mult.len().max(1) - 1)) * self.patch()
    }

    /// Frames per latent frame (after the first) the architecture gives: 2^(temporal levels).
    pub fn temporal_factor(&self) -> i64 {
        1 << self.temperal_downsample.iter().filter(|&&t| t).count()
    }

    /// Colour channels of the pictures (`in_channels / patch²`).
    pub fn pixel_channels(&self) -> i64 {
        self.in_channels / (self.patch() * self.patch())
    }

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
            time: true,
        }
    }

    /// Checks the combinations diffusers would reject or silently misbuild, and that the scale
    /// factors the pipeline reads agree with the architecture.
    pub fn validate(&self) -> Result<(), String> {
        self.layout().validate()?;
        check_stats(self.z_dim, &self.latents_mean, &self.latents_std)?;
        let p = self.patch();
        if p <= 0 || self.in_channels % (p * p) != 0 || self.out_channels % (p * p) != 0 {
            return Err(format!(
                "patch_size {p} must be positive and divide in_channels {} and out_channels {} \
                 by {}",
                self.in_channels,
                self.out_channels,
                p * p
            ));
        }
        if self.in_channels != self.out_channels {
            return Err(format!(
                "in_channels {} and out_channels {} differ: pictures would not round-trip",
                self.in_channels, self.out_channels
            ));
        }
        for (key, given, built) in [
            ("scale_factor_spatial", self.scale_factor_spatial, self.spatial_factor()),
            ("scale_factor_temporal", self.scale_factor_temporal, self.temporal_factor()),
        ] {
            if given.is_some_and(|g| g != built) {
                return Err(format!(
                    "{key} is {}, but dim_mult {:?}, temperal_downsample {:?} and patch_size {p} \
                     give {built}",
                    given.unwrap_or_default(),
                    self.dim_mult,
                    self.temperal_downsample
                ));
            }
        }
        Ok(())
    }
}

impl crate::causal_vae::CausalVaeConfig for WanVaeConfig {
    fn check(&self) -> Result<(), String> {
        self.validate()
    }

    fn vae_layout(&self) -> VaeLayout {
        self.layout()
    }
}
