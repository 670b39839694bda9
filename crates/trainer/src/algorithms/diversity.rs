//! GARDO's diversity features: the projected image embeddings of a CLIP vision tower (GARDO's
//! paper uses DINOv3), computed on the decoded samples in the trainer's device.

use std::path::Path;

use flowtune_models::clip::{ClipImageProcessor, ClipModel};
use image::RgbImage;
use tch::{Device, Kind};

use crate::TrainError;

/// Images per forward pass.
const BATCH: usize = 16;

/// A frozen CLIP model and its image processor.
pub(crate) struct DiversityFeatures {
    model: ClipModel,
    processor: ClipImageProcessor,
    device: Device,
}

impl DiversityFeatures {
    /// Loads the CLIP model folder `dir` onto `device` in f32.
    pub fn load(dir: &Path, device: Device) -> Result<Self, TrainError> {
        let context = |e: flowtune_models::ModelError| {
            TrainError::Invalid(format!("actor.gardo.features {}: {e}", dir.display()))
        };
        Ok(Self {
            model: ClipModel::load(dir, device, Kind::Float).map_err(context)?,
            processor: ClipImageProcessor::load(dir).map_err(context)?,
            device,
        })
    }

    /// One embedding per image.
    pub fn embed(&self, images: &[RgbImage]) -> Result<Vec<Vec<f32>>, TrainError> {
        let _guard = tch::no_grad_guard();
        let mut out = Vec::with_capacity(images.len());
        for chunk in images.chunks(BATCH) {
            let raw: Vec<(usize, usize, &[u8])> = chunk
                .iter()
                .map(|i| (i.height() as usize, i.width() as usize, i.as_raw().as_slice()))
                .collect();
            let pixels = self.processor.pixel_values(&raw, self.device)?;
            let embeds =
                self.model.image_embeds(&pixels)?.to_kind(Kind::Float).to_device(Device::Cpu);
            out.extend(Vec::<Vec<f32>>::try_from(&embeds)?);
        }
        Ok(out)
    }
}
