//! `CLIPModel`: both towers, their projections into the shared embedding space, and the learned
//! logit scale, loaded from a transformers folder (`config.json` + safetensors).

use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::vision::{ClipVisionConfig, ClipVisionTower, VisionOutput};
use crate::nn::{Linear, Scope};
use crate::text_encoders::clip::{ClipTextConfig, ClipTextTower};
use crate::weights::{checkpoint_files, load_weights, LoadOptions};
use crate::{read_config, ModelError};

/// Mirror of transformers' `CLIPConfig`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClipConfig {
    pub text_config: ClipTextConfig,
    pub vision_config: ClipVisionConfig,
    /// Width of the shared space (both projections; overrides `text_config.projection_dim`).
    pub projection_dim: i64,
    pub logit_scale_init_value: f64,
}

impl Default for ClipConfig {
    fn default() -> Self {
        Self {
            text_config: ClipTextConfig::default(),
            vision_config: ClipVisionConfig::default(),
            projection_dim: 512,
            logit_scale_init_value: 2.6592,
        }
    }
}

/// A CLIP model with frozen weights.
pub struct ClipModel {
    pub config: ClipConfig,
    text: ClipTextTower,
    vision: ClipVisionTower,
    visual_projection: Linear,
    logit_scale: Tensor,
    pub store: VarStore,
}

impl ClipModel {
    /// A model on `device` for `kind` weights, unfilled.
    pub fn new(config: &ClipConfig, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let store = crate::weights::store(device, kind);
        let root = Scope::root(store.root(), None);
        let text_config =
            ClipTextConfig { projection_dim: config.projection_dim, ..config.text_config.clone() };
        let vision = ClipVisionTower::new(&root, &config.vision_config)?;
        Ok(Self {
            text: ClipTextTower::new(&root, &text_config, true)?,
            visual_projection: (&root / "visual_projection").linear(
                config.vision_config.hidden_size,
                config.projection_dim,
                false,
            ),
            logit_scale: root.var("logit_scale", &[]),
            vision,
            config: config.clone(),
            store,
        })
    }

    /// Loads `dir/config.json` and its safetensors (position-id buffers that older checkpoints
    /// carry are skipped) as `kind`, frozen.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let config: ClipConfig = read_config(&dir.join("config.json"))?;
        let mut model = Self::new(&config, device, kind)?;
        let options = LoadOptions {
            kind: Some(kind),
            ignored_suffixes: &[".position_ids"],
            ..Default::default()
        };
        load_weights(&mut model.store, &checkpoint_files(dir)?, options)?;
        model.store.freeze();
        Ok(model)
    }

    /// Projected image embeddings (B, projection_dim), not normalised.
    pub fn image_embeds(&self, pixel_values: &Tensor) -> Result<Tensor, ModelError> {
        Ok(self.visual_projection.forward(&self.vision(pixel_values)?.pooled))
    }

    /// The vision tower's outputs.
    pub fn vision(&self, pixel_values: &Tensor) -> Result<VisionOutput, ModelError> {
        self.vision.forward(pixel_values)
    }

    /// Projected text embeddings (B, projection_dim) of token ids (B, L), not normalised.
    pub fn text_embeds(&self, ids: &Tensor) -> Result<Tensor, ModelError> {
        self.text
            .forward(ids)?
            .text_embeds
            .ok_or_else(|| ModelError::Input("CLIP without text_projection".into()))
    }

    /// `exp(logit_scale)`: the factor on cosine similarities.
    pub fn logit_scale(&self) -> f64 {
        self.logit_scale.exp().double_value(&[])
    }
}
