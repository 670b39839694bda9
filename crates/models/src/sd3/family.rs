//! SD3 / SD3.5's registry entry.

use std::path::Path;

use tch::{Device, Kind};

use super::{write_tiny_sd3, Sd3Pipeline, Sd3Transformer, TinySd3Spec};
use crate::denoiser::TrainableDenoiser;
use crate::family::{FlowPipeline, PipelineOptions};
use crate::lora::LoraConfig;
use crate::pipeline::PipelineDir;
use crate::registry::Family;
use crate::ModelError;

/// Stable Diffusion 3 / 3.5 (`StableDiffusion3Pipeline`).
pub const FAMILY: Family = Family {
    name: "sd3",
    pipeline_classes: &["StableDiffusion3Pipeline"],
    denoiser_class: "SD3Transformer2DModel",
    components: &[
        ("transformer", "SD3Transformer2DModel (MMDiT)"),
        ("vae", "AutoencoderKL, or none for a pixel-space pipeline"),
        ("text_encoder, text_encoder_2", "CLIPTextModelWithProjection (CLIP-L, CLIP-G)"),
        ("text_encoder_3", "T5EncoderModel (optional)"),
        ("tokenizer, tokenizer_2, tokenizer_3", "any tokenizer with a tokenizer.json"),
        ("scheduler", "FlowMatchEulerDiscreteScheduler"),
    ],
    load,
    load_denoiser,
    write_tiny,
};

fn load(dir: &PipelineDir, options: &PipelineOptions) -> Result<Box<dyn FlowPipeline>, ModelError> {
    Ok(Box::new(Sd3Pipeline::open(dir.clone(), options)?))
}

fn load_denoiser(
    dir: &Path,
    device: Device,
    kind: Kind,
    lora: Option<&LoraConfig>,
) -> Result<Box<dyn TrainableDenoiser>, ModelError> {
    Ok(Box::new(Sd3Transformer::load(dir, device, kind, lora)?))
}

fn write_tiny(dir: &Path, seed: u64) -> Result<(), ModelError> {
    write_tiny_sd3(dir, &TinySd3Spec { seed, ..Default::default() })
}
