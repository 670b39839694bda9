//! Mirror of `vae/config.json` of `AutoencoderKLQwenImage`.

use serde::{Deserialize, Serialize};

use crate::causal_vae::VaeLayout;

/// `AutoencoderKLQwenImage` config, with diffusers' field names and defaults (the Qwen-Image VAE).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct QwenVaeConfig {
    #[serde(rename = "_class_name", skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
    /// Channels of the first level; level i has `base_dim · dim_mult[i]`.
    pub base_dim: i64,
    /// Latent channels.
    pub z_dim: i64,
    pub dim_mult: Vec<i64>,
    pub num_res_blocks: usize,
    /// Encoder scales (1, 1/2, …) whose residual blocks are followed by attention.
    pub attn_scales: Vec<f64>,
    /// Per downsampling level: whether it also halves time (the decoder mirrors it).
    pub temperal_downsample: Vec<bool>,
    /// Training-only; inference ignores it.
    pub dropout: f64,
    pub input_channels: i64,
    /// Per-channel statistics: the denoiser works on `(z − mean) / std`.
    pub latents_mean: Vec<f64>,
    pub latents_std: Vec<f64>,
}

impl Default for QwenVaeConfig {
    fn default() -> Self {
        Self {
            class_name: Some("AutoencoderKLQwenImage".into()),
            base_dim: 96,
            z_dim: 16,
            dim_mult: vec![1, 2, 4, 4],
            num_res_blocks: 2,
            attn_scales: vec![],
            temperal_downsample: vec![false, true, true],
            dropout: 0.0,
            input_channels: 3,
            latents_mean: vec![
                -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134,
                -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
            ],
            latents_std: vec![
                2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526,
                2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
            ],
        }
    }
}

impl QwenVaeConfig {
    /// Spatial downsampling factor of the latents: 2^(levels − 1).
    pub fn spatial_factor(&self) -> i64 {
        1 << (self.dim_mult.len().max(1) - 1)
    }

    /// The architecture (Wan2.1's layout, `input_channels` in and out).
    pub(crate) fn layout(&self) -> VaeLayout {
        VaeLayout {
            base_dim: self.base_dim,
            decoder_base_dim: self.base_dim,
            z_dim: self.z_dim,
            dim_mult: self.dim_mult.clone(),
            num_res_blocks: self.num_res_blocks,
            attn_scales: self.attn_scales.clone(),
            temperal_downsample: self.temperal_downsample.clone(),
            in_channels: self.input_channels,
            out_channels: self.input_channels,
            is_residual: false,
            time: true,
        }
    }

    /// Checks the combinations diffusers would reject or silently misbuild.
    pub fn validate(&self) -> Result<(), String> {
        self.layout().validate()?;
        crate::causal_vae::check_stats(self.z_dim, &self.latents_mean, &self.latents_std)
    }
}

impl crate::causal_vae::CausalVaeConfig for QwenVaeConfig {
    fn check(&self) -> Result<(), String> {
        self.validate()
    }

    fn vae_layout(&self) -> VaeLayout {
        self.layout()
    }
}
