//! FLUX.1's registry entry.

use super::{write_tiny_flux, FluxPipeline, FluxTransformer, TinyFluxSpec};
use crate::registry::Family;

/// FLUX.1 [dev] and [schnell] (`FluxPipeline`).
pub const FAMILY: Family = Family {
    name: "flux",
    pipeline_classes: &["FluxPipeline"],
    refused_classes: &[],
    denoiser_class: "FluxTransformer2DModel",
    lora_targets: &crate::lora::FLUX_TARGETS,
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
    load: |dir, options| Ok(Box::new(FluxPipeline::open(dir.clone(), options)?)),
    load_denoiser: |dir, device, kind, lora| {
        Ok(Box::new(FluxTransformer::load(dir, device, kind, lora)?))
    },
    write_tiny: |dir, seed| write_tiny_flux(dir, &TinyFluxSpec { seed, ..Default::default() }),
    condition_sizes: crate::condition_sizes::no_tokens,
};
