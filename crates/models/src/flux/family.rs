//! FLUX.1's registry entry.

use std::path::Path;

use tch::{Device, Kind};

use super::{write_tiny_flux, FluxPipeline, FluxTransformer, TinyFluxSpec};
use crate::denoiser::TrainableDenoiser;
use crate::family::{FlowPipeline, PipelineOptions};
use crate::lora::LoraConfig;
use crate::pipeline::PipelineDir;
use crate::registry::Family;
use crate::ModelError;

/// FLUX.1 [dev] and [schnell] (`FluxPipeline`).
pub const FAMILY: Family = Family {
    name: "flux",
    pipeline_classes: &["FluxPipeline"],
    denoiser_class: "FluxTransformer2DModel",
    components: &[
        (
            "transformer",
            "FluxTransformer2DModel (double- then single-stream, 2×2 packed latents, guidance \
             embedding for [dev])",
        ),
        ("vae", "AutoencoderKL (16 channels, scaling and shift factors)"),
        ("text_encoder", "CLIPTextModel (CLIP-L, pooled output)"),
        ("text_encoder_2", "T5EncoderModel (T5-XXL)"),
        ("tokenizer, tokenizer_2", "any tokenizer with a tokenizer.json"),
        ("scheduler", "FlowMatchEulerDiscreteScheduler (dynamic shifting for [dev])"),
    ],
    load,
    load_denoiser,
    write_tiny,
};

fn load(dir: &PipelineDir, options: &PipelineOptions) -> Result<Box<dyn FlowPipeline>, ModelError> {
    Ok(Box::new(FluxPipeline::open(dir.clone(), options)?))
}

fn load_denoiser(
    dir: &Path,
    device: Device,
    kind: Kind,
    lora: Option<&LoraConfig>,
) -> Result<Box<dyn TrainableDenoiser>, ModelError> {
    Ok(Box::new(FluxTransformer::load(dir, device, kind, lora)?))
}

fn write_tiny(dir: &Path, seed: u64) -> Result<(), ModelError> {
    write_tiny_flux(dir, &TinyFluxSpec { seed, ..Default::default() })
}
