//! Parity with diffusers / the reference framework over `schedule.json` and `sde_steps.*`.

use flowtune_fixtures::{json, tensors, Checker};
use flowtune_sampling::{
    reverse_step, Draw, GridRequest, Pipeline, SchedulerConfig, SdeType, SigmaGrid, StepParams,
};
use serde_json::Value;
use tch::Tensor;

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().expect("array").iter().map(|x| x.as_f64().expect("number") as f32).collect()
}

fn grid_of(case: &Value) -> SigmaGrid {
    let config: SchedulerConfig = serde_json::from_value(case["config"].clone()).expect("config");
    let request = GridRequest {
        steps: case["steps"].as_u64().expect("steps") as usize,
        pipeline: Pipeline::parse(case["pipeline"].as_str().unwrap_or("sd3")).expect("pipeline"),
        image_seq_len: case["image_seq_len"].as_u64(),
        sigmas: None,
    };
    SigmaGrid::new(&config, &request).expect("grid")
}

fn schedule_case<'a>(cases: &'a [Value], name: &str) -> &'a Value {
    cases.iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no schedule {name}"))
}

#[test]
fn sigma_grids_match_diffusers() {
    let cases = json("schedule.json");
    let mut check = Checker::new("schedule.json");
    for case in cases.as_array().expect("list of cases") {
        check.case();
        let name = case["name"].as_str().unwrap_or("?");
        let grid = grid_of(case);
        let sigmas = floats(&case["sigmas"]);
        let timesteps = floats(&case["timesteps"]);
        check.close(
            &format!("{name} sigmas"),
            &Tensor::from_slice(&grid.sigmas),
            &Tensor::from_slice(&sigmas),
        );
        check.close(
            &format!("{name} timesteps"),
            &Tensor::from_slice(&grid.timesteps),
            &Tensor::from_slice(&timesteps),
        );
        match (case["mu"].as_f64(), grid.mu) {
            (Some(want), Some(got)) => check.close_scalar(&format!("{name} mu"), got, want),
            (None, None) => {}
            (want, got) => check.fail(format!("{name} mu: got {got:?}, reference {want:?}")),
        }
        // The spec asks for bit-identical grids: the rollout and the trainer must agree exactly.
        if grid.sigmas != sigmas || grid.timesteps != timesteps {
            check.fail(format!("{name}: the grid is not bit-identical to diffusers'"));
        }
        // The trainer's exact lookup finds every timestep of the reference grid.
        for (i, t) in timesteps.iter().enumerate() {
            if grid.index_of(*t).ok() != Some(i) {
                check.fail(format!("{name}: reference timestep {t} is not step {i} of our grid"));
            }
        }
    }
    check.finish();
}

#[test]
fn reverse_steps_match_reference() {
    let spec = json("sde_steps.json");
    let t = tensors("sde_steps.safetensors");
    let schedules = json("schedule.json");
    let grid = grid_of(schedule_case(
        schedules.as_array().expect("cases"),
        spec["schedule"].as_str().expect("schedule"),
    ));
    let sigmas = floats(&spec["sigmas"]);
    let (sample, model_output) = (&t["sample"], &t["model_output"]);
    let rows = sample.size()[0];
    let mut check = Checker::new("sde_steps.*");
    check.close("grid sigmas", &Tensor::from_slice(&grid.sigmas), &Tensor::from_slice(&sigmas));
    for case in spec["cases"].as_array().expect("cases") {
        check.case();
        let key = case["key"].as_str().expect("key");
        let step = case["step"].as_u64().expect("step") as usize;
        let sde_type: SdeType = serde_json::from_value(case["sde_type"].clone()).expect("sde_type");
        let (sigma, sigma_next) = grid.step_sigmas(grid.timesteps[step]).expect("on grid");
        check.close_scalar(&format!("{key} sigma"), sigma as f64, case["sigma"].as_f64().unwrap());
        check.close_scalar(
            &format!("{key} sigma_prev"),
            sigma_next as f64,
            case["sigma_prev"].as_f64().unwrap(),
        );
        let sigma = Tensor::from_slice(&vec![sigma; rows as usize]);
        let sigma_next = Tensor::from_slice(&vec![sigma_next; rows as usize]);
        let mut params = StepParams {
            sde_type,
            noise_level: case["noise_level"].as_f64().expect("noise_level"),
            log_prob_normalizer: true,
            sigma_1: grid.sigmas[1] as f64,
        };
        let run = |params: &StepParams, draw| {
            reverse_step(params, model_output, sample, &sigma, &sigma_next, draw).expect("step")
        };
        let drawn = run(&params, Draw::Noise(&t["noise"]));
        check.close(
            &format!("{key}.prev_sample"),
            &drawn.prev_sample,
            &t[&format!("{key}.prev_sample")],
        );
        check.close(
            &format!("{key}.prev_sample_mean"),
            &drawn.prev_sample_mean,
            &t[&format!("{key}.prev_sample_mean")],
        );
        check.close(&format!("{key}.log_prob"), &drawn.log_prob, &t[&format!("{key}.log_prob")]);
        for (field, out) in [("std_dev_t", &drawn.std_dev_t), ("sqrt_dt", &drawn.sqrt_dt)] {
            let want = case[field].as_f64().expect(field);
            check.close(
                &format!("{key} {field}"),
                out,
                &Tensor::from_slice(&vec![want; rows as usize]),
            );
        }
        let given = run(&params, Draw::Given(&t["given_prev_sample"]));
        check.close(
            &format!("{key}.log_prob_given_prev"),
            &given.log_prob,
            &t[&format!("{key}.log_prob_given_prev")],
        );
        params.log_prob_normalizer = false;
        let bare = run(&params, Draw::Given(&t["given_prev_sample"]));
        let name = format!("{key}.log_prob_given_prev_no_normalizer");
        check.close(&name, &bare.log_prob, &t[&name]);
    }
    check.finish();
}
