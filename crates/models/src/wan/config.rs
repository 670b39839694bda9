//! Mirror of `transformer/config.json` of `WanTransformer3DModel`.

use serde::{Deserialize, Serialize};

/// `WanTransformer3DModel` config, with diffusers' field names and defaults (Wan2.1-T2V-14B's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WanTransformerConfig {
    #[serde(rename = "_class_name", skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
    /// Patch size (frames, rows, columns) of the 3-D patch embedding.
    pub patch_size: Vec<i64>,
    pub num_attention_heads: i64,
    pub attention_head_dim: i64,
    /// Latent channels in (48 for Wan2.2-TI2V-5B, 16 otherwise).
    pub in_channels: i64,
    /// Latent channels predicted (`None` in the file means `in_channels`).
    pub out_channels: Option<i64>,
    /// Width of the text encoder's states (UMT5-XXL: 4096).
    pub text_dim: i64,
    /// Channels of the sinusoidal timestep features.
    pub freq_dim: i64,
    pub ffn_dim: i64,
    pub num_layers: usize,
    /// Whether the cross-attention input goes through an affine LayerNorm (`norm2`).
    pub cross_attn_norm: bool,
    /// Recorded by diffusers but not read: every attention RMS-normalises its queries and keys
    /// across heads.
    pub qk_norm: Option<String>,
    pub eps: f64,
    /// The image-to-video CLIP image embedder (Wan2.1-I2V; not supported).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_dim: Option<i64>,
    /// The image-to-video added key/value projections (not supported).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub added_kv_proj_dim: Option<i64>,
    /// Positions each rotary axis covers.
    pub rope_max_seq_len: i64,
    /// FLF2V's image position embedding (not supported).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pos_embed_seq_len: Option<i64>,
}

impl Default for WanTransformerConfig {
    fn default() -> Self {
        Self {
            class_name: Some("WanTransformer3DModel".into()),
            patch_size: vec![1, 2, 2],
            num_attention_heads: 40,
            attention_head_dim: 128,
            in_channels: 16,
            out_channels: Some(16),
            text_dim: 4096,
            freq_dim: 256,
            ffn_dim: 13824,
            num_layers: 40,
            cross_attn_norm: true,
            qk_norm: Some("rms_norm_across_heads".into()),
            eps: 1e-6,
            image_dim: None,
            added_kv_proj_dim: None,
            rope_max_seq_len: 1024,
            pos_embed_seq_len: None,
        }
    }
}

impl WanTransformerConfig {
    /// Width of the token stream (`num_attention_heads · attention_head_dim`).
    pub fn inner_dim(&self) -> i64 {
        self.num_attention_heads * self.attention_head_dim
    }

    /// Latent channels predicted.
    pub fn out_dim(&self) -> i64 {
        self.out_channels.filter(|&c| c > 0).unwrap_or(self.in_channels)
    }

    /// The patch size as (frames, rows, columns).
    pub fn patch(&self) -> [i64; 3] {
        [self.patch_size[0], self.patch_size[1], self.patch_size[2]]
    }

    /// Rotary widths per axis (frames, rows, columns): rows and columns get `2·(d / 6)` each,
    /// frames the rest of the head width `d`.
    pub fn rope_dims(&self) -> [i64; 3] {
        let hw = 2 * (self.attention_head_dim / 6);
        [self.attention_head_dim - 2 * hw, hw, hw]
    }

    /// Checks the options flowtune does not run (image conditioning) and the shapes diffusers
    /// would misbuild.
    pub fn validate(&self) -> Result<(), String> {
        for (key, value) in [
            ("image_dim", self.image_dim),
            ("added_kv_proj_dim", self.added_kv_proj_dim),
            ("pos_embed_seq_len", self.pos_embed_seq_len),
        ] {
            if let Some(v) = value {
                return Err(format!(
                    "{key} is {v}: the image-to-video image embedder is not supported \
                     (text-to-video and TI2V configs only)"
                ));
            }
        }
        if self.patch_size.len() != 3 || self.patch_size.iter().any(|&p| p <= 0) {
            return Err(format!("patch_size {:?} must be three positive sizes", self.patch_size));
        }
        if self.num_attention_heads <= 0 || self.attention_head_dim <= 0 {
            return Err("num_attention_heads and attention_head_dim must be positive".into());
        }
        if self.rope_dims().iter().any(|d| d % 2 != 0 || *d <= 0) {
            return Err(format!(
                "attention_head_dim {} splits into rotary widths {:?}; each must be even and \
                 positive",
                self.attention_head_dim,
                self.rope_dims()
            ));
        }
        if self.freq_dim <= 0 || self.freq_dim % 2 != 0 {
            return Err(format!("freq_dim {} must be even and positive", self.freq_dim));
        }
        Ok(())
    }
}
