//! Qwen-Image's registry entry.

use super::{
    write_tiny_qwen_image, QwenImagePipeline, QwenImageTransformer, TinyQwenImageSpec, EDIT_PLUS,
};
use crate::registry::Family;

/// Qwen-Image (`QwenImagePipeline`) and Qwen-Image-Edit-Plus (`QwenImageEditPlusPipeline`).
pub const FAMILY: Family = Family {
    name: "qwen_image",
    pipeline_classes: &["QwenImagePipeline", EDIT_PLUS],
    refused_classes: &[],
    denoiser_class: "QwenImageTransformer2DModel",
    lora_targets: &crate::lora::QWEN_IMAGE_TARGETS,
    components: &[
        ("transformer", "QwenImageTransformer2DModel (dual-stream MMDiT, 2×2 packed latents)"),
        ("vae", "AutoencoderKLQwenImage (causal 3-D, one frame per image)"),
        ("text_encoder", "Qwen2_5_VLForConditionalGeneration (its language model, text only)"),
        ("tokenizer", "Qwen2 BPE (tokenizer.json, or vocab.json + merges.txt)"),
        ("processor", "Qwen2VLProcessor (Edit-Plus: the vision tower's image processor)"),
        ("scheduler", "FlowMatchEulerDiscreteScheduler (dynamic shifting)"),
    ],
    load: |dir, options| Ok(Box::new(QwenImagePipeline::open(dir.clone(), options)?)),
    load_denoiser: |dir, device, kind, lora| {
        Ok(Box::new(QwenImageTransformer::load(dir, device, kind, lora)?))
    },
    write_tiny: |dir, seed| {
        write_tiny_qwen_image(dir, &TinyQwenImageSpec { seed, ..Default::default() })
    },
    condition_sizes: super::condition_sizes,
};
