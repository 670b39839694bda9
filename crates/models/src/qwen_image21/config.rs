//! Mirror of `transformer/config.json` of `QwenImage21Transformer2DModel`.

use serde::{Deserialize, Serialize};

/// `QwenImage21Transformer2DModel` config, with diffusers' field names and defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct QwenImage21TransformerConfig {
    #[serde(rename = "_class_name", skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
    /// 1: the pipeline feeds latents unpatched, one token per latent cell.
    pub patch_size: i64,
    /// Latent channels of a token.
    pub in_channels: i64,
    pub out_channels: Option<i64>,
    pub num_layers: usize,
    pub attention_head_dim: i64,
    pub num_attention_heads: i64,
    /// Width of the text encoder's states.
    pub context_in_dim: i64,
    /// SwiGLU width over the stream width.
    pub mlp_ratio: i64,
    /// Rotary dimensions of the frame, row and column axes; they sum to `attention_head_dim`.
    pub axes_dims_rope: [i64; 3],
    pub eps: f64,
    /// Text and condition-image tokens are modulated from `t = 0`.
    pub causal_condition: bool,
}

impl Default for QwenImage21TransformerConfig {
    fn default() -> Self {
        Self {
            class_name: Some("QwenImage21Transformer2DModel".into()),
            patch_size: 1,
            in_channels: 64,
            out_channels: Some(64),
            num_layers: 32,
            attention_head_dim: 128,
            num_attention_heads: 32,
            context_in_dim: 4096,
            mlp_ratio: 3,
            axes_dims_rope: [16, 56, 56],
            eps: 1e-6,
            causal_condition: true,
        }
    }
}

impl QwenImage21TransformerConfig {
    /// Width of the token stream.
    pub fn inner_dim(&self) -> i64 {
        self.num_attention_heads * self.attention_head_dim
    }

    /// Channels of a predicted token.
    pub fn out_channels(&self) -> i64 {
        self.out_channels.unwrap_or(self.in_channels)
    }

    /// Checks the combinations diffusers would misbuild or the pipeline does not run.
    pub fn validate(&self) -> Result<(), String> {
        let axes: i64 = self.axes_dims_rope.iter().sum();
        if axes != self.attention_head_dim || self.axes_dims_rope.iter().any(|d| d % 2 != 0) {
            return Err(format!(
                "axes_dims_rope {:?}: expected even dimensions summing to attention_head_dim {}",
                self.axes_dims_rope, self.attention_head_dim
            ));
        }
        if self.patch_size != 1 {
            return Err(format!(
                "patch_size {} is not supported (QwenImage21Pipeline feeds latents unpatched: 1)",
                self.patch_size
            ));
        }
        if self.out_channels() != self.in_channels {
            return Err(format!(
                "out_channels {} differs from in_channels {}: the prediction is a velocity of the \
                 latents",
                self.out_channels(),
                self.in_channels
            ));
        }
        if self.mlp_ratio <= 0 {
            return Err(format!("mlp_ratio {} must be positive", self.mlp_ratio));
        }
        Ok(())
    }
}
