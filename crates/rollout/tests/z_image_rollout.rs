//! A Z-Image trajectory end to end against `scripts/reference_z_image_rollout.py`: the tiny
//! pipeline of `flowtune make-tiny z-image` loaded through the registry, prompts in the Qwen3
//! chat template with each row's valid tokens, CFG against the `""` negative prompt (the
//! pipeline's `c + g(c − u)`, same `g`), Z-Image's sigmas, an SDE window, given noise, and the decoded
//! pictures (scaling and shift factors) — all equal to diffusers' components in a loop.

mod common;

use flowtune_fixtures::{dir, tensors, Checker, MODEL_RTOL};
use flowtune_models::PipelineOptions;
use flowtune_rollout::{encode_rows, sample_trajectory, Engine, Guidance, TrajectoryRequest};
use flowtune_sampling::SamplerConfig;
use tch::{Device, Kind};

/// The script's `PROMPTS` and `SPEC` (guidance 3 in diffusers' convention).
const PROMPTS: [&str; 2] = [
    "a red circle next to a blue square",
    "一只猫坐在垫子上, \"OPEN\" 24/7, with a long caption that runs past thirty-two tokens of \
     the template so the two rows pad to different lengths",
];
const STEPS: usize = 6;
const GUIDANCE: f64 = 3.0;
const WINDOW: std::ops::Range<usize> = 1..4;

#[test]
fn z_image_rollout_matches_diffusers_loop() {
    let io = tensors("z_image_rollout_io.safetensors");
    let pipe = flowtune_models::load_pipeline(
        &dir().join("z_image_pipeline"),
        &PipelineOptions::new(Device::Cpu),
    )
    .expect("load the tiny pipeline");
    let sampler = SamplerConfig {
        n: 1,
        steps: STEPS,
        guidance_scale: GUIDANCE,
        noise_level: 0.7,
        sde_window_size: WINDOW.len(),
        ..Default::default()
    };
    let latent_shape = pipe.latent_shape(24, 40).expect("24 × 40");
    assert_eq!(latent_shape, [16, 12, 20]);
    let engine = Engine::new(pipe.as_ref(), &sampler, latent_shape, 0).expect("engine");
    let mut check = Checker::new("z_image_rollout_io.safetensors");
    check.case();
    let text = encode_rows(pipe.as_ref(), &PROMPTS, &[], &[], None).expect("prompts");
    let negative = encode_rows(pipe.as_ref(), &[pipe.default_negative_prompt(); 2], &[], &[], None)
        .expect("negative");
    for (name, cond) in [("prompt", &text), ("negative_prompt", &negative)] {
        let mask = cond.mask.as_ref().expect("a mask");
        check.close_within(
            &format!("{name}_mask"),
            &mask.to_kind(Kind::Float),
            &io[&format!("output.{name}_mask")].to_kind(Kind::Float),
            0.0,
        );
        check.close_within(
            &format!("{name}_embeds"),
            &cond.embeds,
            &io[&format!("output.{name}_embeds")],
            MODEL_RTOL,
        );
    }
    let guidance = Guidance { scale: GUIDANCE, scale_2: None, negative: Some(&negative) };
    let out = common::check_trajectory(&mut check, &io, &engine, &text, guidance, &vec![WINDOW; 2]);
    common::check_decoded(&mut check, &io, pipe.as_ref(), &out.final_latents);
    check.finish();
}

/// `scripts/reference_interop.py cfg`: `ZImagePipeline.__call__` (4 Euler steps, given latents)
/// runs CFG whenever `guidance_scale > 0`, so at 0.5 and 1 the guided velocity is used too.
#[test]
fn z_image_runs_cfg_above_zero_as_diffusers() {
    let io = tensors("z_image_cfg_io.safetensors");
    let pipe = flowtune_models::load_pipeline(
        &dir().join("z_image_pipeline"),
        &PipelineOptions::new(Device::Cpu),
    )
    .expect("load the tiny pipeline");
    let prompts = ["a red circle next to a blue square", "a cat on a mat"];
    let text = encode_rows(pipe.as_ref(), &prompts, &[], &[], None).expect("prompts");
    let negative = encode_rows(pipe.as_ref(), &[""; 2], &[], &[], None).expect("negative");
    let mut check = Checker::new("z_image_cfg_io.safetensors");
    for (scale, key) in [(0.0, "g0p0"), (0.5, "g0p5"), (1.0, "g1p0"), (3.0, "g3p0")] {
        check.case();
        assert_eq!(pipe.denoiser().runs_cfg(scale), scale > 0.0);
        let sampler = SamplerConfig { n: 1, steps: 4, guidance_scale: scale, ..Default::default() };
        let engine = Engine::new(pipe.as_ref(), &sampler, pipe.latent_shape(16, 24).unwrap(), 0)
            .expect("engine");
        let request = TrajectoryRequest {
            grid: &engine.grid,
            text: &text,
            guidance: Guidance { scale, scale_2: None, negative: Some(&negative) },
            step: sampler.step_params(engine.grid.sigmas[1] as f64),
            windows: &[0..0, 0..0],
            initial: &io["input.initial_latents"],
        };
        // No SDE window: every step is Euler and the drawn noise unused.
        let noise = |_| io["input.initial_latents"].zeros_like();
        let out =
            tch::no_grad(|| sample_trajectory(pipe.denoiser(), &request, noise)).expect("sampling");
        let want = &io[&format!("output.final_latents.{key}")];
        check.close_within(&format!("final_latents at {scale}"), &out.final_latents, want, 1e-5);
    }
    check.finish();
}
