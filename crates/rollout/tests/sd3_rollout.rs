//! The `sd3_rollout` fixtures: a CFG + SDE-window trajectory through a tiny SD3 transformer (loaded
//! through the family registry) with given noise must reproduce diffusers' latents, log-probs and
//! timesteps.

use flowtune_fixtures::{dir, models_of_kind, tensors, Checker, MODEL_RTOL};
use flowtune_models::TextConditioning;
use flowtune_rollout::{sample_trajectory, Guidance, TrajectoryRequest};
use flowtune_sampling::{GridRequest, SchedulerConfig, SdeType, SigmaGrid, StepParams};
use tch::{Device, Kind};

#[test]
fn sd3_rollouts_match_reference() {
    let mut check = Checker::new("manifest.json sd3_rollout");
    for spec in models_of_kind("sd3_rollout") {
        check.case();
        let name = spec["name"].as_str().expect("name");
        let io = tensors(&format!("{name}_io.safetensors"));
        let model = flowtune_models::load_denoiser(
            &dir().join(spec["model"].as_str().unwrap()),
            Device::Cpu,
            Kind::Float,
            None,
        )
        .expect("load");
        let config: SchedulerConfig =
            serde_json::from_value(spec["scheduler_config"].clone()).expect("scheduler config");
        let steps = spec["steps"].as_u64().unwrap() as usize;
        let grid =
            SigmaGrid::new(&config, &GridRequest { steps, ..Default::default() }).expect("grid");
        let start = spec["window_start"].as_u64().unwrap() as usize;
        let size = spec["window_size"].as_u64().unwrap() as usize;
        let b = spec["batch"].as_u64().unwrap() as usize;
        let windows = vec![start..start + size; b];
        let text = TextConditioning::new(
            io["input.prompt_embeds"].shallow_clone(),
            Some(io["input.pooled_prompt_embeds"].shallow_clone()),
        );
        let negative = TextConditioning::new(
            io["input.negative_prompt_embeds"].shallow_clone(),
            Some(io["input.negative_pooled_prompt_embeds"].shallow_clone()),
        );
        let request = TrajectoryRequest {
            grid: &grid,
            text: &text,
            guidance: Guidance {
                scale: spec["guidance_scale"].as_f64().unwrap(),
                scale_2: None,
                negative: Some(&negative),
            },
            step: StepParams {
                sde_type: serde_json::from_value::<SdeType>(spec["sde_type"].clone()).unwrap(),
                noise_level: spec["noise_level"].as_f64().unwrap(),
                log_prob_normalizer: true,
                sigma_1: grid.sigmas[1] as f64,
            },
            windows: &windows,
            initial: &io["input.initial_latents"],
        };
        let noise = &io["input.step_noise"];
        let out =
            tch::no_grad(|| sample_trajectory(model.as_ref(), &request, |i| noise.get(i as i64)))
                .expect("rollout");
        for (key, t) in [
            ("output.all_latents", &out.all_latents),
            ("output.all_log_probs", &out.all_log_probs),
            ("output.all_timesteps", &out.all_timesteps),
            ("output.final_latents", &out.final_latents),
        ] {
            if t.size() != io[key].size() {
                check.fail(format!(
                    "{name} {key}: shape {:?}, reference {:?}",
                    t.size(),
                    io[key].size()
                ));
                continue;
            }
            check.close_within(&format!("{name} {key}"), t, &io[key], MODEL_RTOL);
        }
    }
    check.finish();
}
