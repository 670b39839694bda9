//! Qwen-Image's registry entry.

use std::path::Path;

use tch::{Device, Kind};

use super::{
    write_tiny_qwen_image, QwenImagePipeline, QwenImageTransformer, TinyQwenImageSpec, EDIT_PLUS,
};
use crate::denoiser::TrainableDenoiser;
use crate::family::{FlowPipeline, PipelineOptions};
use crate::lora::LoraConfig;
use crate::pipeline::PipelineDir;
use crate::registry::Family;
use crate::ModelError;

/// Qwen-Image (`QwenImagePipeline`) and Qwen-Image-Edit-Plus (`QwenImageEditPlusPipeline`).
pub const FAMILY: Family = Family {
    name: "qwen_image",
    pipeline_classes: &["QwenImagePipeline", EDIT_PLUS],
    denoiser_class: "QwenImageTransformer2DModel",
    components: &[
        ("transformer", "QwenImageTransformer2DModel (dual-stream MMDiT, 2×2 packed latents)"),
        ("vae", "AutoencoderKLQwenImage (causal 3-D, one frame per image)"),
        ("text_encoder", "Qwen2_5_VLForConditionalGeneration (its language model, text only)"),
        ("tokenizer", "Qwen2 BPE (tokenizer.json, or vocab.json + merges.txt)"),
        ("processor", "Qwen2VLProcessor (Edit-Plus: the vision tower's image processor)"),
        ("scheduler", "FlowMatchEulerDiscreteScheduler (dynamic shifting)"),
    ],
    load,
    load_denoiser,
    write_tiny,
};

fn load(dir: &PipelineDir, options: &PipelineOptions) -> Result<Box<dyn FlowPipeline>, ModelError> {
    Ok(Box::new(QwenImagePipeline::open(dir.clone(), options)?))
}

fn load_denoiser(
    dir: &Path,
    device: Device,
    kind: Kind,
    lora: Option<&LoraConfig>,
) -> Result<Box<dyn TrainableDenoiser>, ModelError> {
    Ok(Box::new(QwenImageTransformer::load(dir, device, kind, lora)?))
}

fn write_tiny(dir: &Path, seed: u64) -> Result<(), ModelError> {
    write_tiny_qwen_image(dir, &TinyQwenImageSpec { seed, ..Default::default() })
}
