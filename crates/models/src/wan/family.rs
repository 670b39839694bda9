//! Wan's registry entry.

use super::{write_tiny_wan, TinyWanSpec, WanPipeline, WanTransformer};
use crate::registry::Family;

/// Wan2.1, Wan2.2-TI2V-5B and Wan2.2-T2V-A14B text-to-video (`WanPipeline` with one transformer, or
/// two experts split at `boundary_ratio`), and Wan2.2-TI2V image-to-video from a first frame.
pub const FAMILY: Family = Family {
    name: "wan",
    pipeline_classes: &["WanPipeline"],
    refused_classes: &[],
    denoiser_class: "WanTransformer3DModel",
    lora_targets: &crate::lora::WAN_TARGETS,
    components: &[
        (
            "transformer",
            "WanTransformer3DModel (3-D patches, per-sample or per-token timesteps; a held first \
             frame for image-to-video with expand_timesteps)",
        ),
        (
            "transformer_2",
            "optional low-noise expert (Wan2.2-T2V-A14B): steps below boundary_ratio·1000",
        ),
        ("vae", "AutoencoderKLWan (causal video VAE: 4× frames, 8× or 16× sides)"),
        ("text_encoder", "UMT5EncoderModel (states zeroed past the prompt up to 512 tokens)"),
        ("tokenizer", "UMT5 unigram (tokenizer.json)"),
        ("scheduler", "UniPCMultistepScheduler read for its flow sigmas (flow_shift)"),
    ],
    load: |dir, options| Ok(Box::new(WanPipeline::open(dir.clone(), options)?)),
    load_denoiser: |dir, device, kind, lora| {
        Ok(Box::new(WanTransformer::load(dir, device, kind, lora)?))
    },
    write_tiny: |dir, seed| write_tiny_wan(dir, &TinyWanSpec { seed, ..Default::default() }),
    condition_sizes: crate::condition_sizes::no_tokens,
};
