//! Z-Image's registry entry.

use super::{write_tiny_z_image, TinyZImageSpec, ZImagePipeline, ZImageTransformer};
use crate::registry::Family;

/// Z-Image and Z-Image-Turbo (`ZImagePipeline`), text-to-image.
pub const FAMILY: Family = Family {
    name: "z_image",
    pipeline_classes: &["ZImagePipeline"],
    refused_classes: &[],
    denoiser_class: "ZImageTransformer2DModel",
    lora_targets: &super::Z_IMAGE_TARGETS,
    components: &[
        ("transformer", "ZImageTransformer2DModel (single-stream DiT, 2×2 patches)"),
        ("vae", "AutoencoderKL (16 channels, scaling and shift factors)"),
        ("text_encoder", "Qwen3Model (hidden_states[-2] of the chat-templated prompt)"),
        ("tokenizer", "Qwen2 BPE (tokenizer.json, or vocab.json + merges.txt)"),
        ("scheduler", "FlowMatchEulerDiscreteScheduler (sigmas linspace(1, 1/N, N), shift)"),
    ],
    load: |dir, options| Ok(Box::new(ZImagePipeline::open(dir.clone(), options)?)),
    load_denoiser: |dir, device, kind, lora| {
        Ok(Box::new(ZImageTransformer::load(dir, device, kind, lora)?))
    },
    write_tiny: |dir, seed| write_tiny_z_image(dir, &TinyZImageSpec { seed, ..Default::default() }),
    condition_sizes: crate::condition_sizes::no_tokens,
};
