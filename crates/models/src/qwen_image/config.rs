//! Mirror of `transformer/config.json` of `QwenImageTransformer2DModel`.

use serde::{Deserialize, Serialize};

/// `QwenImageTransformer2DModel` config, with diffusers' field names and defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct QwenImageTransformerConfig {
    #[serde(rename = "_class_name", skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
    pub patch_size: i64,
    /// Channels of a packed token: latent channels × patch².
    pub in_channels: i64,
    /// Latent channels of the prediction (unpacked).
    pub out_channels: Option<i64>,
    pub num_layers: usize,
    pub attention_head_dim: i64,
    pub num_attention_heads: i64,
    /// Width of the text encoder's states.
    pub joint_attention_dim: i64,
    /// A guidance-distilled variant's guidance input (diffusers 0.42 builds no embedder for it).
    pub guidance_embeds: bool,
    /// Rotary dimensions per axis (frame, height, width); they sum to `attention_head_dim`.
    pub axes_dims_rope: [i64; 3],
    /// The Edit models' zero timestep for condition-image tokens.
    pub zero_cond_t: bool,
    /// Qwen-Image-Layered's extra timestep condition (not supported).
    pub use_additional_t_cond: bool,
    /// Qwen-Image-Layered's layer-wise rotary embedding (not supported).
    pub use_layer3d_rope: bool,
}

impl Default for QwenImageTransformerConfig {
    fn default() -> Self {
        Self {
            class_name: Some("QwenImageTransformer2DModel".into()),
            patch_size: 2,
            in_channels: 64,
            out_channels: Some(16),
            num_layers: 60,
            attention_head_dim: 128,
            num_attention_heads: 24,
            joint_attention_dim: 3584,
            guidance_embeds: false,
            axes_dims_rope: [16, 56, 56],
            zero_cond_t: false,
            use_additional_t_cond: false,
            use_layer3d_rope: false,
        }
    }
}

impl QwenImageTransformerConfig {
    /// Width of the token streams.
    pub fn inner_dim(&self) -> i64 {
        self.num_attention_heads * self.attention_head_dim
    }

    /// Latent channels the prediction has once unpacked.
    pub fn out_channels(&self) -> i64 {
        self.out_channels.unwrap_or(self.in_channels)
    }

    /// Latent channels of an unpacked input (`in_channels / patch²`).
    pub fn latent_channels(&self) -> i64 {
        self.in_channels / (self.patch_size * self.patch_size)
    }

    /// Checks the combinations diffusers would reject, misbuild, or flowtune does not run.
    pub fn validate(&self) -> Result<(), String> {
        let axes: i64 = self.axes_dims_rope.iter().sum();
        if axes != self.attention_head_dim {
            return Err(format!(
                "axes_dims_rope {:?} sum to {axes}, but attention_head_dim is {}",
                self.axes_dims_rope, self.attention_head_dim
            ));
        }
        if self.axes_dims_rope.iter().any(|d| d % 2 != 0) {
            return Err(format!("axes_dims_rope {:?} must all be even", self.axes_dims_rope));
        }
        let patch = self.patch_size * self.patch_size;
        if self.in_channels % patch != 0 {
            return Err(format!(
                "in_channels {} is not a multiple of patch_size² = {patch}",
                self.in_channels
            ));
        }
        if self.guidance_embeds {
            return Err("guidance_embeds: true is not supported (diffusers 0.42's \
                        QwenImageTransformer2DModel builds no guidance embedder and fails on it)"
                .into());
        }
        if self.use_additional_t_cond || self.use_layer3d_rope {
            return Err("use_additional_t_cond / use_layer3d_rope (Qwen-Image-Layered) are not \
                        supported"
                .into());
        }
        Ok(())
    }
}
