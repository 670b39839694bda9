//! Mirror of `transformer/config.json` of `FluxTransformer2DModel`.

use serde::{Deserialize, Serialize};

/// `FluxTransformer2DModel` config, with diffusers' field names and defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FluxTransformerConfig {
    #[serde(rename = "_class_name", skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
    /// Patch size inside the transformer (1: the pipeline packs 2×2 itself).
    pub patch_size: i64,
    /// Channels of a packed token: latent channels × 4.
    pub in_channels: i64,
    pub out_channels: Option<i64>,
    /// Double-stream blocks.
    pub num_layers: usize,
    /// Single-stream blocks.
    pub num_single_layers: usize,
    pub attention_head_dim: i64,
    pub num_attention_heads: i64,
    /// Width of T5's states.
    pub joint_attention_dim: i64,
    /// Width of CLIP's pooled output.
    pub pooled_projection_dim: i64,
    /// FLUX.1 [dev]: the distilled guidance value goes through its own embedder.
    pub guidance_embeds: bool,
    /// Rotary dimensions per position axis; they sum to `attention_head_dim`.
    pub axes_dims_rope: [i64; 3],
}

impl Default for FluxTransformerConfig {
    fn default() -> Self {
        Self {
            class_name: Some("FluxTransformer2DModel".into()),
            patch_size: 1,
            in_channels: 64,
            out_channels: None,
            num_layers: 19,
            num_single_layers: 38,
            attention_head_dim: 128,
            num_attention_heads: 24,
            joint_attention_dim: 4096,
            pooled_projection_dim: 768,
            guidance_embeds: false,
            axes_dims_rope: [16, 56, 56],
        }
    }
}

impl FluxTransformerConfig {
    /// Width of the token streams.
    pub fn inner_dim(&self) -> i64 {
        self.num_attention_heads * self.attention_head_dim
    }

    /// Channels of a predicted token.
    pub fn out_channels(&self) -> i64 {
        self.out_channels.unwrap_or(self.in_channels)
    }

    /// Latent channels of an unpacked input (`in_channels / 4`).
    pub fn latent_channels(&self) -> i64 {
        self.in_channels / 4
    }

    /// Checks the combinations diffusers would misbuild or flowtune does not run.
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
        if self.patch_size != 1 {
            return Err(format!(
                "patch_size {} is not supported (FluxPipeline packs 2×2 itself: patch_size 1)",
                self.patch_size
            ));
        }
        if self.in_channels % 4 != 0 || self.out_channels() != self.in_channels {
            return Err(format!(
                "in_channels {} / out_channels {} must be equal and a multiple of 4 (2×2 packing)",
                self.in_channels,
                self.out_channels()
            ));
        }
        Ok(())
    }
}
