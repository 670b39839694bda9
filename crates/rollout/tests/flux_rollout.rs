//! A FLUX.1 [dev] trajectory end to end against `scripts/reference_flux_rollout.py`: the tiny
//! pipeline of `flowtune make-tiny flux` loaded through the registry, CLIP pooled + T5 prompt
//! encoding, the distilled guidance through the guidance embedding (no CFG), the dynamic-shift
//! grid, an SDE window, given noise, the decoded pictures and the VAE encoder (scaling and shift
//! factors) — all equal to diffusers' components in a loop.

use flowtune_fixtures::{dir, tensors, Checker, MODEL_RTOL};
use flowtune_models::flux::GUIDANCE;
use flowtune_models::PipelineOptions;
use flowtune_rollout::{encode_rows, sample_trajectory, Engine, Guidance, TrajectoryRequest};
use flowtune_sampling::SamplerConfig;
use tch::{Device, Kind};

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
    let text = encode_rows(pipe.as_ref(), &PROMPTS, &[]).expect("prompts");
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
    let request = TrajectoryRequest {
        grid: &engine.grid,
        text: &text,
        guidance: Guidance { scale: 1.0, negative: None },
        step: engine.sampler.step_params(engine.grid.sigmas[1] as f64),
        windows: &vec![WINDOW; 2],
        initial: &io["input.initial_latents"],
    };
    let noise = &io["input.step_noise"];
    let out = tch::no_grad(|| {
        sample_trajectory(engine.pipe.denoiser(), &request, |i| noise.get(i as i64))
    })
    .expect("rollout");
    for (key, t) in [
        ("output.all_latents", &out.all_latents),
        ("output.all_log_probs", &out.all_log_probs),
        ("output.all_timesteps", &out.all_timesteps),
        ("output.final_latents", &out.final_latents),
    ] {
        check.close_within(key, t, &io[key], MODEL_RTOL);
    }
    let pixels = tch::no_grad(|| pipe.decode_rgb8(&out.final_latents)).expect("decode");
    let want = ((io["output.image"].clamp(-1.0, 1.0) + 1.0) * 127.5)
        .round()
        .permute([0, 2, 3, 1])
        .to_kind(Kind::Int);
    let off = (pixels.to_kind(Kind::Int) - want).abs().max().int64_value(&[]);
    if off > 1 {
        check.fail(format!("decoded pictures differ from diffusers' by {off} levels"));
    }
    let encoded = tch::no_grad(|| pipe.encode_rgb8(&io["input.pixels"])).expect("encode");
    check.close_within("encoded_latents", &encoded, &io["output.encoded_latents"], MODEL_RTOL);
    check.finish();
}
