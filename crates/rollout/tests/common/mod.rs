//! Checks shared by the pipeline rollout tests.

use std::collections::HashMap;
use std::ops::Range;

use flowtune_fixtures::{Checker, MODEL_RTOL};
use flowtune_models::{FlowPipeline, TextConditioning};
use flowtune_rollout::{sample_trajectory, Engine, Guidance, Trajectory, TrajectoryRequest};
use tch::{Kind, Tensor};

/// The fixture's trajectory from its initial latents and step noise, compared key by key.
pub fn check_trajectory(
    check: &mut Checker,
    io: &HashMap<String, Tensor>,
    engine: &Engine<'_>,
    text: &TextConditioning,
    guidance: Guidance<'_>,
    windows: &[Range<usize>],
) -> Trajectory {
    let request = TrajectoryRequest {
        grid: &engine.grid,
        text,
        guidance,
        step: engine.sampler.step_params(engine.grid.sigmas[1] as f64),
        windows,
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
    out
}

/// `latents` decoded by `pipe` within one level of the fixture's `output.image`.
pub fn check_decoded(
    check: &mut Checker,
    io: &HashMap<String, Tensor>,
    pipe: &dyn FlowPipeline,
    latents: &Tensor,
) {
    let pixels = tch::no_grad(|| pipe.decode_rgb8(latents)).expect("decode");
    let want = ((io["output.image"].clamp(-1.0, 1.0) + 1.0) * 127.5)
        .round()
        .permute([0, 2, 3, 1])
        .to_kind(Kind::Int);
    let off = (pixels.to_kind(Kind::Int) - want).abs().max().int64_value(&[]);
    if off > 1 {
        check.fail(format!("decoded pictures differ from diffusers' by {off} levels"));
    }
}
