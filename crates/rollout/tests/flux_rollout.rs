//! A FLUX.1 [dev] trajectory end to end against `scripts/reference_flux_rollout.py`: the tiny
//! pipeline of `flowtune make-tiny flux` loaded through the registry, CLIP pooled + T5 prompt
//! encoding, the distilled guidance through the guidance embedding (no CFG), the dynamic-shift
//! grid, an SDE window, given noise, the decoded pictures and the VAE encoder (scaling and shift
//! factors) — all equal to diffusers' components in a loop.

mod common;

use flowtune_fixtures::{dir, tensors, Checker, MODEL_RTOL};
use flowtune_models::flux::GUIDANCE;
use flowtune_models::PipelineOptions;
use flowtune_rollout::{encode_rows, Engine, Guidance};
use flowtune_sampling::SamplerConfig;
use tch::Device;

/// The script's `PROMPTS` and `SPEC`.
const PROMPTS: [&str; 2] =
    ["a red circle next to a blue square", "a cat sitting on a mat, \"OPEN\" 24/7"];
const STEPS: usize = 6;
const EMBEDDED_GUIDANCE: f64 = 2.5;
const WINDOW: std::ops::Range<usize> = 1..4;

#[test]
fn flux_rollout_matches_diffusers_loop() {
    let io = tensors("flux_rollout_io.safetensors");
    let options = PipelineOptions {
        max_sequence_length: Some(16),
        embedded_guidance: Some(EMBEDDED_GUIDANCE),
        ..PipelineOptions::new(Device::Cpu)
    };
    let pipe = flowtune_models::load_pipeline(&dir().join("flux_pipeline"), &options)
        .expect("load the tiny pipeline");
    let sampler = SamplerConfig {
        n: 1,
        steps: STEPS,
        guidance_scale: 1.0,
        noise_level: 0.7,
        sde_window_size: WINDOW.len(),
        ..Default::default()
    };
    let latent_shape = pipe.latent_shape(24, 40).expect("24 × 40");
    assert_eq!(latent_shape, [16, 12, 20]);
    let engine = Engine::new(pipe.as_ref(), &sampler, latent_shape, 0).expect("engine");
    let mut check = Checker::new("flux_rollout_io.safetensors");
    check.case();
    let text = encode_rows(pipe.as_ref(), &PROMPTS, &[], &[], None).expect("prompts");
    check.close_within("prompt_embeds", &text.embeds, &io["output.prompt_embeds"], MODEL_RTOL);
    let pooled = text.pooled.as_ref().expect("pooled");
    check.close_within(
        "pooled_prompt_embeds",
        pooled,
        &io["output.pooled_prompt_embeds"],
        MODEL_RTOL,
    );
    let guidance = Vec::<f64>::try_from(&text.extras[GUIDANCE]).unwrap();
    assert_eq!(guidance, [EMBEDDED_GUIDANCE; 2], "the guidance extra rides with every row");
    let guidance = Guidance { scale: 1.0, scale_2: None, negative: None };
    let out = common::check_trajectory(&mut check, &io, &engine, &text, guidance, &vec![WINDOW; 2]);
    common::check_decoded(&mut check, &io, pipe.as_ref(), &out.final_latents);
    let encoded = tch::no_grad(|| pipe.encode_rgb8(&io["input.pixels"])).expect("encode");
    check.close_within("encoded_latents", &encoded, &io["output.encoded_latents"], MODEL_RTOL);
    check.finish();
}
