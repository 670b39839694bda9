//! Mirror of `transformer/config.json` of `Flux2Transformer2DModel`.

use serde::{Deserialize, Serialize};

/// Position axes of every FLUX.2 token id: (time, row, column, text index).
pub const AXES: usize = 4;

/// `Flux2Transformer2DModel` config, with diffusers' field names and defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Flux2TransformerConfig {
    #[serde(rename = "_class_name", skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
    /// Patch size inside the transformer (1: the pipeline patchifies 2×2 itself).
    pub patch_size: i64,
    /// Channels of a token: VAE latent channels × 4.
    pub in_channels: i64,
    pub out_channels: Option<i64>,
    /// Double-stream blocks.
    pub num_layers: usize,
    /// Single-stream blocks.
    pub num_single_layers: usize,
    pub attention_head_dim: i64,
    pub num_attention_heads: i64,
    /// Width of the text encoder's stacked hidden states.
    pub joint_attention_dim: i64,
    /// Sinusoid channels of the timestep and guidance embedders.
    pub timestep_guidance_channels: i64,
    /// Feed-forward width over the stream width.
    pub mlp_ratio: f64,
    /// Rotary dimensions per position axis; they sum to `attention_head_dim`.
    pub axes_dims_rope: Vec<i64>,
    pub rope_theta: f64,
    pub eps: f64,
    /// FLUX.2 [dev]: the distilled guidance value goes through its own embedder.
    pub guidance_embeds: bool,
    /// `is_distilled` of the pipeline's `model_index.json` (a step-distilled [klein] runs no
    /// CFG); not part of the transformer's config file.
    #[serde(skip)]
    pub is_distilled: bool,
}

impl Default for Flux2TransformerConfig {
    fn default() -> Self {
        Self {
            class_name: Some("Flux2Transformer2DModel".into()),
            patch_size: 1,
            in_channels: 128,
            out_channels: None,
            num_layers: 8,
            num_single_layers: 48,
            attention_head_dim: 128,
            num_attention_heads: 48,
            joint_attention_dim: 15360,
            timestep_guidance_channels: 256,
            mlp_ratio: 3.0,
            axes_dims_rope: vec![32, 32, 32, 32],
            rope_theta: 2000.0,
            eps: 1e-6,
            guidance_embeds: true,
            is_distilled: false,
        }
    }
}

impl Flux2TransformerConfig {
    /// Width of the token streams.
    pub fn inner_dim(&self) -> i64 {
        self.num_attention_heads * self.attention_head_dim
    }

    /// Hidden width of every feed-forward (`int(dim · mlp_ratio)`).
    pub fn mlp_hidden(&self) -> i64 {
        (self.inner_dim() as f64 * self.mlp_ratio) as i64
    }

    /// Channels of a predicted token.
    pub fn out_channels(&self) -> i64 {
        self.out_channels.unwrap_or(self.in_channels)
    }

    /// Checks the combinations diffusers would misbuild or flowtune does not run.
    pub fn validate(&self) -> Result<(), String> {
        let axes: i64 = self.axes_dims_rope.iter().sum();
        if self.axes_dims_rope.len() != AXES || axes != self.attention_head_dim {
            return Err(format!(
                "axes_dims_rope {:?}: expected {AXES} axes summing to attention_head_dim {}",
                self.axes_dims_rope, self.attention_head_dim
            ));
        }
        if self.axes_dims_rope.iter().any(|d| d % 2 != 0) {
            return Err(format!("axes_dims_rope {:?} must all be even", self.axes_dims_rope));
        }
        if self.patch_size != 1 {
            return Err(format!(
                "patch_size {} is not supported (Flux2 pipelines patchify 2×2 themselves: \
                 patch_size 1)",
                self.patch_size
            ));
        }
        if self.in_channels % 4 != 0 || self.out_channels() != self.in_channels {
            return Err(format!(
                "in_channels {} / out_channels {} must be equal and a multiple of 4 (2×2 patches)",
                self.in_channels,
                self.out_channels()
            ));
        }
        if self.timestep_guidance_channels % 2 != 0 || self.mlp_hidden() <= 0 {
            return Err(format!(
                "timestep_guidance_channels {} must be even and mlp_ratio {} positive",
                self.timestep_guidance_channels, self.mlp_ratio
            ));
        }
        Ok(())
    }
}
