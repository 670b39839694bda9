//! `flowtune bench step --overlap-ab ROUNDS`: the recipe's step with `reward.overlap` on and off,
//! ROUNDS runs each, alternating which goes first, to show how much of the scoring the overlap
//! hides behind sampling. The serial runs' rollout phase is sampling plus scoring; the overlapped
//! one's is close to the larger of the two when each chunk scores faster than the next one
//! samples.

use flowtune_config::Recipe;
use flowtune_objectives::Metrics;
use flowtune_trainer::{train_with, TrainOptions};
use serde_json::{json, Value};
use tch::Device;

use crate::Failure;

/// What the measured steps of `rounds` pairs of runs took, overlapped against serial.
pub fn overlap_ab(
    recipe: &Recipe,
    device: Device,
    options: TrainOptions,
    rounds: u32,
) -> Result<Value, Failure> {
    // [overlapped, serial]: each run's measured (last) step.
    let mut runs: [Vec<Metrics>; 2] = [vec![], vec![]];
    for round in 0..rounds {
        let order = if round % 2 == 0 { [true, false] } else { [false, true] };
        for overlap in order {
            let mut recipe = recipe.clone();
            recipe.reward.overlap = overlap;
            let summary = train_with(&recipe, device, options).map_err(Failure::training)?;
            let last = summary.metrics.last().cloned().unwrap_or_default();
            runs[usize::from(!overlap)].push(last);
        }
    }
    let mean = |runs: &[Metrics], key: &str| {
        runs.iter().filter_map(|m| m.get(key)).sum::<f64>() / runs.len().max(1) as f64
    };
    let side = |runs: &[Metrics]| {
        json!({
            "step_s": mean(runs, "timing_s/step"),
            "rollout_s": mean(runs, "timing_s/gen"),
            "reward_s": mean(runs, "timing_s/reward"),
        })
    };
    let (overlapped, serial) = (&runs[0], &runs[1]);
    // Serially the rollout phase holds sampling, then scoring.
    let scoring = mean(serial, "timing_s/reward");
    let sampling = mean(serial, "timing_s/gen") - scoring;
    // What the overlap takes off the rollout phase (the step's other phases are the same work).
    let hidden = mean(serial, "timing_s/gen") - mean(overlapped, "timing_s/gen");
    let rewards: Vec<Option<f64>> =
        runs.iter().flatten().map(|m| m.get("critic/rewards/mean").copied()).collect();
    let identical = rewards.windows(2).all(|w| w[0] == w[1]);
    Ok(json!({
        "rounds": rounds,
        "overlapped": side(overlapped),
        "serial": side(serial),
        "sampling_s": sampling,
        "scoring_s": scoring,
        "max_s": sampling.max(scoring),
        "sum_s": sampling + scoring,
        "overlapped_rollout_over_max": mean(overlapped, "timing_s/gen") / sampling.max(scoring),
        "hidden_s": hidden,
        "hidden_fraction": hidden / scoring,
        "rewards_identical": identical,
    }))
}
