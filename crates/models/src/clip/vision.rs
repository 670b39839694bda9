//! The CLIP vision tower (`vision_model.*`): patch embedding, class token and learned positions,
//! pre-layer-norm, the shared encoder, and the post-layer-normed class token as pooled output.

use serde::{Deserialize, Serialize};
use tch::Tensor;

use super::encoder::{Encoder, EncoderShape};
use crate::nn::{Embedding, LayerNorm, Scope};
use crate::ModelError;

/// Mirror of transformers' `CLIPVisionConfig` (defaults: ViT-B/32).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClipVisionConfig {
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i64,
    pub num_channels: i64,
    pub image_size: i64,
    pub patch_size: i64,
    pub hidden_act: String,
    pub layer_norm_eps: f64,
}

impl Default for ClipVisionConfig {
    fn default() -> Self {
        Self {
            hidden_size: 768,
            intermediate_size: 3072,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            num_channels: 3,
            image_size: 224,
            patch_size: 32,
            hidden_act: "quick_gelu".into(),
            layer_norm_eps: 1e-5,
        }
    }
}

/// What the vision tower gives: every token's state, and the pooled class token.
pub struct VisionOutput {
    /// Encoder output (B, 1 + patches, D), not post-normed.
    pub last_hidden_state: Tensor,
    /// The class token after `post_layernorm` (B, D).
    pub pooled: Tensor,
}

/// `vision_model` of a `CLIPModel`.
pub struct ClipVisionTower {
    pub config: ClipVisionConfig,
    patch_embedding: Tensor,
    class_embedding: Tensor,
    position_embedding: Embedding,
    pre_layrnorm: LayerNorm,
    encoder: Encoder,
    post_layernorm: LayerNorm,
}

impl ClipVisionTower {
    pub fn new(root: &Scope<'_>, config: &ClipVisionConfig) -> Result<Self, ModelError> {
        if config.patch_size <= 0 || config.image_size % config.patch_size != 0 {
            return Err(ModelError::Input(format!(
                "CLIP vision image_size {} is not a multiple of patch_size {}",
                config.image_size, config.patch_size
            )));
        }
        let vision = root / "vision_model";
        let embeddings = &vision / "embeddings";
        let (d, p, eps) = (config.hidden_size, config.patch_size, config.layer_norm_eps);
        let positions = (config.image_size / p).pow(2) + 1;
        let shape = EncoderShape {
            hidden_size: d,
            intermediate_size: config.intermediate_size,
            num_hidden_layers: config.num_hidden_layers,
            num_attention_heads: config.num_attention_heads,
            layer_norm_eps: eps,
            hidden_act: config.hidden_act.clone(),
        };
        Ok(Self {
            patch_embedding: (&embeddings / "patch_embedding")
                .var("weight", &[d, config.num_channels, p, p]),
            class_embedding: embeddings.var("class_embedding", &[d]),
            position_embedding: Embedding::new(&(&embeddings / "position_embedding"), positions, d),
            pre_layrnorm: LayerNorm::new(&(&vision / "pre_layrnorm"), d, eps),
            encoder: Encoder::new(&vision, &shape)?,
            post_layernorm: LayerNorm::new(&(&vision / "post_layernorm"), d, eps),
            config: config.clone(),
        })
    }

    /// Encodes normalised pixels (B, C, image_size, image_size).
    pub fn forward(&self, pixel_values: &Tensor) -> Result<VisionOutput, ModelError> {
        let s = self.config.image_size;
        match pixel_values.size()[..] {
            [_, c, h, w] if c == self.config.num_channels && h == s && w == s => {}
            ref other => {
                return Err(ModelError::Input(format!(
                    "CLIP pixel_values must be (B, {}, {s}, {s}), got {other:?}",
                    self.config.num_channels
                )))
            }
        }
        let b = pixel_values.size()[0];
        let p = self.config.patch_size;
        let x = pixel_values.to_kind(self.patch_embedding.kind());
        let patches = x
            .conv2d(&self.patch_embedding, None::<Tensor>, [p, p], [0, 0], [1, 1], 1)
            .flatten(2, -1)
            .transpose(1, 2);
        let class = self.class_embedding.view([1, 1, -1]).expand([b, 1, -1], false);
        let tokens = Tensor::cat(&[class, patches], 1);
        let n = tokens.size()[1];
        let positions = Tensor::arange(n, (tch::Kind::Int64, tokens.device()));
        let x = self.pre_layrnorm.forward(&(tokens + self.position_embedding.forward(&positions)));
        let last = self.encoder.forward(x, false).last;
        let pooled = self.post_layernorm.forward(&last.select(1, 0));
        Ok(VisionOutput { last_hidden_state: last, pooled })
    }
}
