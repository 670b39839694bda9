//! SD3 / SD3.5's registry entry.

use super::{write_tiny_sd3, Sd3Pipeline, Sd3Transformer, TinySd3Spec};
use crate::registry::Family;

/// Stable Diffusion 3 / 3.5 (`StableDiffusion3Pipeline`).
pub const FAMILY: Family = Family {
    name: "sd3",
    pipeline_classes: &["StableDiffusion3Pipeline"],
    refused_classes: &[],
    denoiser_class: "SD3Transformer2DModel",
    lora_targets: &crate::lora::SD3_ATTENTION_TARGETS,
    components: &[
        ("transformer", "SD3Transformer2DModel (MMDiT)"),
        ("vae", "AutoencoderKL, or none for a pixel-space pipeline"),
        ("text_encoder, text_encoder_2", "CLIPTextModelWithProjection (CLIP-L, CLIP-G)"),
        ("text_encoder_3", "T5EncoderModel (optional)"),
        ("tokenizer, tokenizer_2, tokenizer_3", "any tokenizer with a tokenizer.json"),
        ("scheduler", "FlowMatchEulerDiscreteScheduler"),
    ],
    load: |dir, options| Ok(Box::new(Sd3Pipeline::open(dir.clone(), options)?)),
    load_denoiser: |dir, device, kind, lora| {
        Ok(Box::new(Sd3Transformer::load(dir, device, kind, lora)?))
    },
    write_tiny: |dir, seed| write_tiny_sd3(dir, &TinySd3Spec { seed, ..Default::default() }),
    condition_sizes: crate::condition_sizes::no_tokens,
};
