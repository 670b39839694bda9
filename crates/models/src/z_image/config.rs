//! Mirror of `transformer/config.json` of `ZImageTransformer2DModel`.

use serde::{Deserialize, Serialize};

/// `ZImageTransformer2DModel` config, with diffusers' field names and defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ZImageTransformerConfig {
    #[serde(rename = "_class_name", skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
    /// Spatial patch sizes, one embedder and final layer per (patch, frame patch) pair.
    pub all_patch_size: Vec<i64>,
    /// Frame patch sizes, paired with `all_patch_size`.
    pub all_f_patch_size: Vec<i64>,
    /// Latent channels (in and out).
    pub in_channels: i64,
    pub dim: i64,
    pub n_layers: usize,
    pub n_refiner_layers: usize,
    pub n_heads: i64,
    /// Recorded by diffusers but unused: every attention has `n_heads` key/value heads.
    pub n_kv_heads: i64,
    pub norm_eps: f64,
    pub qk_norm: bool,
    /// Width of the text encoder's states.
    pub cap_feat_dim: i64,
    /// Z-Image-Omni's SigLIP branch (not supported).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub siglip_feat_dim: Option<i64>,
    pub rope_theta: f64,
    /// The timestep embedder sees `t_scale · t`.
    pub t_scale: f64,
    /// Rotary dimensions per axis (caption/frame, row, column); they sum to the head width.
    pub axes_dims: Vec<i64>,
    /// Positions each axis's rotary table covers.
    pub axes_lens: Vec<i64>,
}

impl Default for ZImageTransformerConfig {
    fn default() -> Self {
        Self {
            class_name: Some("ZImageTransformer2DModel".into()),
            all_patch_size: vec![2],
            all_f_patch_size: vec![1],
            in_channels: 16,
            dim: 3840,
            n_layers: 30,
            n_refiner_layers: 2,
            n_heads: 30,
            n_kv_heads: 30,
            norm_eps: 1e-5,
            qk_norm: true,
            cap_feat_dim: 2560,
            siglip_feat_dim: None,
            rope_theta: 256.0,
            t_scale: 1000.0,
            axes_dims: vec![32, 48, 48],
            axes_lens: vec![1024, 512, 512],
        }
    }
}

/// The (patch, frame patch) pair the text-to-image pipeline runs.
pub const PIPELINE_PATCH: (i64, i64) = (2, 1);

impl ZImageTransformerConfig {
    /// Width of one attention head.
    pub fn head_dim(&self) -> i64 {
        self.dim / self.n_heads
    }

    /// Width of the timestep embedding and of the adaLN inputs.
    pub fn adaln_dim(&self) -> i64 {
        self.dim.min(super::ADALN_EMBED_DIM)
    }

    /// Hidden width of the SwiGLU feed-forward (`int(dim / 3 * 8)`).
    pub fn ffn_dim(&self) -> i64 {
        (self.dim as f64 / 3.0 * 8.0) as i64
    }

    /// Checks the combinations diffusers would reject or flowtune does not run.
    pub fn validate(&self) -> Result<(), String> {
        if self.siglip_feat_dim.is_some() {
            return Err("siglip_feat_dim is set: Z-Image-Omni's SigLIP branch is not supported \
                        (text-to-image ZImagePipeline only)"
                .into());
        }
        if self.all_patch_size.len() != self.all_f_patch_size.len() {
            return Err(format!(
                "all_patch_size {:?} and all_f_patch_size {:?} must have the same length",
                self.all_patch_size, self.all_f_patch_size
            ));
        }
        let pairs = self.patch_pairs();
        if !pairs.contains(&PIPELINE_PATCH) {
            return Err(format!(
                "(all_patch_size, all_f_patch_size) pairs {pairs:?} lack (2, 1), the one \
                 ZImagePipeline runs"
            ));
        }
        if self.n_heads <= 0 || self.dim % self.n_heads != 0 {
            return Err(format!("dim {} is not a multiple of n_heads {}", self.dim, self.n_heads));
        }
        if self.axes_dims.len() != 3 || self.axes_lens.len() != 3 {
            return Err(format!(
                "axes_dims {:?} and axes_lens {:?} must have three entries",
                self.axes_dims, self.axes_lens
            ));
        }
        let axes: i64 = self.axes_dims.iter().sum();
        if axes != self.head_dim() || self.axes_dims.iter().any(|d| d % 2 != 0) {
            return Err(format!(
                "axes_dims {:?} must be even and sum to the head width dim / n_heads = {}",
                self.axes_dims,
                self.head_dim()
            ));
        }
        Ok(())
    }

    /// The (patch, frame patch) pairs, in config order.
    pub fn patch_pairs(&self) -> Vec<(i64, i64)> {
        self.all_patch_size.iter().copied().zip(self.all_f_patch_size.iter().copied()).collect()
    }
}
