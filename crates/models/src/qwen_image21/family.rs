//! Qwen-Image 2.1's registry entry.

use super::TinyQwenImage21Spec;
use super::{write_tiny_qwen_image21, QwenImage21Pipeline, QwenImage21Transformer};
use crate::registry::Family;

/// Qwen-Image 2.1 (`QwenImage21Pipeline`), from text and with condition images.
pub const FAMILY: Family = Family {
    name: "qwen_image21",
    pipeline_classes: &["QwenImage21Pipeline"],
    refused_classes: &[],
    denoiser_class: "QwenImage21Transformer2DModel",
    lora_targets: &super::QWEN_IMAGE21_TARGETS,
    components: &[
        (
            "transformer",
            "QwenImage21Transformer2DModel (single-stream, block-causal, one shared modulation, \
             3-axis rotary positions; one token per latent cell)",
        ),
        ("vae", "AutoencoderKLQwenImage21 (Wan2.2's residual layout, 2-D convolutions, 16×, z 64)"),
        (
            "text_encoder",
            "Qwen3VLForConditionalGeneration (the language model's last layer before its final \
             norm; the vision tower and deepstack fill the condition images' slots)",
        ),
        ("processor", "Qwen3VLProcessor (its Qwen2 BPE tokenizer and Qwen2-VL image processor)"),
        (
            "scheduler",
            "FlowMatchEulerDiscreteScheduler (the author's sample_sigmas, μ of the tokens)",
        ),
    ],
    load: |dir, options| Ok(Box::new(QwenImage21Pipeline::open(dir.clone(), options)?)),
    load_denoiser: |dir, device, kind, lora| {
        Ok(Box::new(QwenImage21Transformer::load(dir, device, kind, lora)?))
    },
    write_tiny: |dir, seed| {
        write_tiny_qwen_image21(dir, &TinyQwenImage21Spec { seed, ..Default::default() })
    },
    condition_sizes: super::condition_sizes,
};
