//! FLUX.2's registry entry.

use super::{write_tiny_flux2, Flux2Pipeline, Flux2Transformer, TinyFlux2Spec};
use crate::registry::Family;

/// FLUX.2 [klein] (`Flux2KleinPipeline`) and [dev] (`Flux2Pipeline`).
pub const FAMILY: Family = Family {
    name: "flux2",
    pipeline_classes: &["Flux2KleinPipeline", "Flux2Pipeline"],
    refused_classes: &[],
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
            "[klein]: Qwen3ForCausalLM / Qwen3Model (hidden states 9, 18, 27 side by side); \
             [dev]: Mistral3ForConditionalGeneration's language model (hidden states 10, 20, 30; \
             the Pixtral vision tower is not loaded)",
        ),
        (
            "tokenizer",
            "[klein]: Qwen2 BPE (tokenizer.json, or vocab.json + merges.txt); [dev]: \
             PixtralProcessor's tokenizer.json (Mistral chat turns with the system message, \
             left-padded)",
        ),
        ("scheduler", "FlowMatchEulerDiscreteScheduler (linspace sigmas, empirical μ)"),
    ],
    load: |dir, options| Ok(Box::new(Flux2Pipeline::open(dir.clone(), options)?)),
    load_denoiser: |dir, device, kind, lora| {
        Ok(Box::new(Flux2Transformer::load(dir, device, kind, lora)?))
    },
    write_tiny: |dir, seed| write_tiny_flux2(dir, &TinyFlux2Spec { seed, ..Default::default() }),
    condition_sizes: super::condition_sizes,
};
