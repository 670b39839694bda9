//! Mirror of `transformer/config.json` of `SD3Transformer2DModel`.

use serde::{Deserialize, Serialize};

/// `SD3Transformer2DModel` config, with diffusers' field names and defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Sd3TransformerConfig {
    #[serde(rename = "_class_name", skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
    pub sample_size: i64,
    pub patch_size: i64,
    pub in_channels: i64,
    pub num_layers: usize,
    pub attention_head_dim: i64,
    pub num_attention_heads: i64,
    pub joint_attention_dim: i64,
    pub caption_projection_dim: i64,
    pub pooled_projection_dim: i64,
    pub out_channels: Option<i64>,
    pub pos_embed_max_size: i64,
    /// Blocks that add a second, image-only self-attention (SD3.5 "MMDiT-X").
    pub dual_attention_layers: Vec<usize>,
    /// `rms_norm` (SD3.5) or none.
    pub qk_norm: Option<String>,
}

impl Default for Sd3TransformerConfig {
    fn default() -> Self {
        Self {
            class_name: Some("SD3Transformer2DModel".into()),
            sample_size: 128,
            patch_size: 2,
            in_channels: 16,
            num_layers: 18,
            attention_head_dim: 64,
            num_attention_heads: 18,
            joint_attention_dim: 4096,
            caption_projection_dim: 1152,
            pooled_projection_dim: 2048,
            out_channels: Some(16),
            pos_embed_max_size: 96,
            dual_attention_layers: vec![],
            qk_norm: None,
        }
    }
}

impl Sd3TransformerConfig {
    /// Width of the token stream.
    pub fn inner_dim(&self) -> i64 {
        self.num_attention_heads * self.attention_head_dim
    }

    pub fn out_channels(&self) -> i64 {
        self.out_channels.unwrap_or(self.in_channels)
    }

    /// Checks the combinations diffusers would reject or silently misbuild.
    pub fn validate(&self) -> Result<(), String> {
        if self.caption_projection_dim != self.inner_dim() {
            return Err(format!(
                "caption_projection_dim {} must equal num_attention_heads × attention_head_dim = {}",
                self.caption_projection_dim,
                self.inner_dim()
            ));
        }
        match self.qk_norm.as_deref() {
            None | Some("rms_norm") => {}
            Some(other) => {
                return Err(format!(
                    "qk_norm `{other}` is not supported; expected rms_norm or null"
                ))
            }
        }
        if let Some(bad) = self.dual_attention_layers.iter().find(|&&i| i >= self.num_layers) {
            return Err(format!(
                "dual_attention_layers names block {bad}, but num_layers is {}",
                self.num_layers
            ));
        }
        Ok(())
    }
}
