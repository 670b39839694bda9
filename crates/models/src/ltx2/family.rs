//! LTX-2's registry entry.

use super::pipeline::Ltx2Pipeline;
use super::tiny::{write_tiny_ltx2, TinyLtx2Spec};
use super::transformer::{Ltx2Transformer, LTX2_TARGETS};
use crate::registry::Family;

/// LTX-2.0 and LTX-2.3 text-to-video with sound (`LTX2Pipeline`), and image-to-video with sound
/// from a first-frame picture (rows with a picture; `LTX2ImageToVideoPipeline` folders hold the
/// same components): one latent of video and audio tokens denoised together. The latent
/// upsampler, temporal refinement and in-context LoRA are refused by name; prompt enhancement is
/// never run (prompts are used as written).
pub const FAMILY: Family = Family {
    name: "ltx2",
    pipeline_classes: &["LTX2Pipeline", "LTX2ImageToVideoPipeline"],
    refused_classes: &[
        (
            "LTX2LatentUpsamplePipeline",
            "the latent upsampler is a second-stage refiner, not a denoiser flowtune trains",
        ),
        (
            "LTX2DFRTemporalRefinePipeline",
            "temporal refinement runs after sampling; flowtune trains the base LTX2Pipeline",
        ),
        (
            "LTX2InContextPipeline",
            "in-context LoRA conditioning (reference videos) is not supported",
        ),
        ("LTX2ConditionPipeline", "conditioning on frames or clips is not supported"),
        ("LTX2DFRPipeline", "the DFR tiled sampler is not supported; use LTX2Pipeline"),
        ("LTX2HDRPipeline", "HDR reference conditioning is not supported"),
        (
            "LTX2VideoDiffusionDecodePipeline",
            "diffusion decoding is a decoder stage, not a denoiser flowtune trains",
        ),
    ],
    denoiser_class: "LTX2VideoTransformer3DModel",
    lora_targets: &LTX2_TARGETS,
    components: &[
        (
            "transformer",
            "LTX2VideoTransformer3DModel (video and audio streams with cross-modal attention)",
        ),
        ("vae", "AutoencoderKLLTX2Video (8× frames, 32× sides)"),
        ("audio_vae", "AutoencoderKLLTX2Audio (mel spectrograms, 4× time and mel bins)"),
        ("vocoder", "LTX2Vocoder or LTX2VocoderWithBWE (mel → waveform)"),
        ("text_encoder", "Gemma3ForConditionalGeneration (hidden states of every layer)"),
        ("tokenizer", "Gemma (tokenizer.json), left padding"),
        ("connectors", "LTX2TextConnectors (video and audio text states)"),
        ("scheduler", "FlowMatchEulerDiscreteScheduler (dynamic shift of the video tokens)"),
    ],
    load: |dir, options| Ok(Box::new(Ltx2Pipeline::open(dir.clone(), options)?)),
    load_denoiser: |dir, device, kind, lora| {
        Ok(Box::new(Ltx2Transformer::load(dir, device, kind, lora)?))
    },
    write_tiny: |dir, seed| write_tiny_ltx2(dir, &TinyLtx2Spec { seed, ..Default::default() }),
    condition_sizes: crate::condition_sizes::no_tokens,
};
