//! FLUX.2's registry entry.

use super::{write_tiny_flux2, Flux2KleinPipeline, Flux2Transformer, TinyFlux2Spec};
use crate::registry::Family;

/// FLUX.2 [klein] (`Flux2KleinPipeline`); FLUX.2 [dev] (`Flux2Pipeline`) is recognised and
/// refused by name.
pub const FAMILY: Family = Family {
    name: "flux2",
    pipeline_classes: &["Flux2KleinPipeline", "Flux2Pipeline"],
    denoiser_class: "Flux2Transformer2DModel",
    lora_targets: &super::FLUX2_TARGETS,
    components: &[
        (
            "transformer",
            "Flux2Transformer2DModel (double- then single-stream, shared modulations, SwiGLU, \
             4-axis rotary positions; one token per 2×2 latent patch)",
        ),
        ("vae", "AutoencoderKLFlux2 (quant convs, 2×2 patches normalised by its batch norm)"),
        (
            "text_encoder",
            "Qwen3ForCausalLM / Qwen3Model (hidden states 9, 18, 27 side by side); [dev]'s \
             Mistral3ForConditionalGeneration is refused",
        ),
        ("tokenizer", "Qwen2 BPE (tokenizer.json, or vocab.json + merges.txt)"),
        ("scheduler", "FlowMatchEulerDiscreteScheduler (linspace sigmas, empirical μ)"),
    ],
    load: |dir, options| Ok(Box::new(Flux2KleinPipeline::open(dir.clone(), options)?)),
    load_denoiser: |dir, device, kind, lora| {
        Ok(Box::new(Flux2Transformer::load(dir, device, kind, lora)?))
    },
    write_tiny: |dir, seed| write_tiny_flux2(dir, &TinyFlux2Spec { seed, ..Default::default() }),
};
