//! Z-Image's registry entry.

use std::path::Path;

use tch::{Device, Kind};

use super::{write_tiny_z_image, TinyZImageSpec, ZImagePipeline, ZImageTransformer};
use crate::denoiser::TrainableDenoiser;
use crate::family::{FlowPipeline, PipelineOptions};
use crate::lora::LoraConfig;
use crate::pipeline::PipelineDir;
use crate::registry::Family;
use crate::ModelError;

/// Z-Image and Z-Image-Turbo (`ZImagePipeline`), text-to-image.
pub const FAMILY: Family = Family {
    name: "z_image",
    pipeline_classes: &["ZImagePipeline"],
    denoiser_class: "ZImageTransformer2DModel",
    components: &[
        ("transformer", "ZImageTransformer2DModel (single-stream DiT, 2×2 patches)"),
        ("vae", "AutoencoderKL (16 channels, scaling and shift factors)"),
        ("text_encoder", "Qwen3Model (hidden_states[-2] of the chat-templated prompt)"),
        ("tokenizer", "Qwen2 BPE (tokenizer.json, or vocab.json + merges.txt)"),
        ("scheduler", "FlowMatchEulerDiscreteScheduler (sigmas linspace(1, 1/N, N), shift)"),
    ],
    load,
    load_denoiser,
    write_tiny,
};

fn load(dir: &PipelineDir, options: &PipelineOptions) -> Result<Box<dyn FlowPipeline>, ModelError> {
    Ok(Box::new(ZImagePipeline::open(dir.clone(), options)?))
}

fn load_denoiser(
    dir: &Path,
    device: Device,
    kind: Kind,
    lora: Option<&LoraConfig>,
) -> Result<Box<dyn TrainableDenoiser>, ModelError> {
    Ok(Box::new(ZImageTransformer::load(dir, device, kind, lora)?))
}

fn write_tiny(dir: &Path, seed: u64) -> Result<(), ModelError> {
    write_tiny_z_image(dir, &TinyZImageSpec { seed, ..Default::default() })
}
