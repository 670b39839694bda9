//! `flowtune bench shapes`: the algorithm sandbox. Each algorithm's shapes recipe
//! (`examples/shapes/<algorithm>.yaml`, else the Flow-GRPO recipe with `algorithm=<name>`) runs
//! for the same steps and seeds; the table compares validation accuracy before and after, the
//! gain per minute of training, the time per step, and the accuracy per sampling step of the
//! validation samples (a few-step DMD2 student's against a 10-step sampler's).

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use flowtune_config::Recipe;

use super::shapes_log::RunLog;
use crate::Failure;

#[derive(Args)]
pub struct ShapesBenchArgs {
    /// Comma-separated recipe names: `examples/shapes/<name>.yaml` (every algorithm has one, and
    /// `dpo_offline`), else the Flow-GRPO recipe with `algorithm=<name>`.
    #[arg(long, value_delimiter = ',', default_value = "flow_grpo")]
    algorithms: Vec<String>,
    /// Training steps per run; by default the recipe's `trainer.total_steps` (with `--minutes`, a cap).
    #[arg(long)]
    steps: Option<u64>,
    /// Give every run the same training time instead: stop after the step that crosses it.
    #[arg(long)]
    minutes: Option<f64>,
    /// Comma-separated seeds; each algorithm runs once per seed.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    seeds: Vec<u64>,
    /// Where the runs go (`<out>/<algorithm>_seed<S>`).
    #[arg(long, default_value = "runs/bench_shapes")]
    out: PathBuf,
    /// Recipe overrides applied to every run.
    overrides: Vec<String>,
}

/// One run's yardsticks.
struct Outcome {
    steps: f64,
    before: f64,
    after: f64,
    minutes: f64,
    ms_per_step: f64,
    /// Denoising steps of a validation sample, and whether each runs CFG (two forwards).
    sampling: (usize, bool),
}

/// How a recipe's validation samples: a DMD2 student on its own grid without CFG, else
/// `rollout.eval_steps` with CFG when the scale asks for it.
fn sampling(recipe: &Recipe) -> (usize, bool) {
    match recipe.algorithm.as_str() {
        "dmd2" => (recipe.actor.dmd2.student_steps, false),
        _ => (recipe.rollout.eval_steps, recipe.rollout.guidance_scale > 1.0),
    }
}

fn recipe_for(algorithm: &str) -> (PathBuf, Option<String>) {
    let own = PathBuf::from(format!("examples/shapes/{algorithm}.yaml"));
    if own.exists() {
        (own, None)
    } else {
        (PathBuf::from("examples/shapes/flow_grpo.yaml"), Some(format!("algorithm={algorithm}")))
    }
}

fn run_one(
    a: &ShapesBenchArgs,
    algorithm: &str,
    seed: u64,
    device: tch::Device,
) -> Result<Outcome, Failure> {
    let out = a.out.join(format!("{algorithm}_seed{seed}"));
    let (path, algorithm_override) = recipe_for(algorithm);
    let mut overrides = a.overrides.clone();
    overrides.extend(algorithm_override);
    overrides.extend([
        format!("seed={seed}"),
        // Validation before the first step and after the last only.
        format!("trainer.val_freq={}", u32::MAX),
        "trainer.val_before_train=true".into(),
        "trainer.resume=none".into(),
        "trainer.save_freq=0".into(),
        format!("trainer.output_dir={}", out.display()),
    ]);
    if let Some(steps) = a.steps {
        overrides.push(format!("trainer.total_steps={steps}"));
    }
    if let Some(minutes) = a.minutes {
        overrides.push(format!("trainer.time_limit_s={}", minutes * 60.0));
    }
    let recipe = Recipe::load(&path, &overrides).map_err(Failure::input)?;
    let _ = std::fs::remove_dir_all(&out);
    let start = Instant::now();
    flowtune_trainer::train(&recipe, device).map_err(|e| Failure::Runtime(e.into()))?;
    let minutes = start.elapsed().as_secs_f64() / 60.0;
    outcome(&out, minutes, sampling(&recipe)).map_err(Failure::Runtime)
}

fn outcome(out: &Path, minutes: f64, sampling: (usize, bool)) -> anyhow::Result<Outcome> {
    let log = RunLog::read(out)?;
    let (first, last) = log.before_after();
    Ok(Outcome {
        steps: last.step as f64,
        before: first.accuracy,
        after: last.accuracy,
        minutes,
        ms_per_step: 1000.0 * log.mean_of("timing_s/step"),
        sampling,
    })
}

pub fn run(a: ShapesBenchArgs, device: tch::Device) -> Result<(), Failure> {
    let mut rows = vec![];
    for algorithm in &a.algorithms {
        let outcomes: Vec<Outcome> = a
            .seeds
            .iter()
            .map(|&seed| run_one(&a, algorithm, seed, device))
            .collect::<Result<_, _>>()?;
        rows.push((algorithm.clone(), outcomes));
    }
    println!(
        "\n{:<14} {:>5} {:>6} {:>8} {:>8} {:>8} {:>10} {:>9} {:>9} {:>9}",
        "algorithm",
        "seeds",
        "steps",
        "before",
        "after",
        "gain",
        "gain/min",
        "ms/step",
        "sampling",
        "acc/step"
    );
    for (algorithm, outcomes) in &rows {
        let mean = |f: &dyn Fn(&Outcome) -> f64| {
            outcomes.iter().map(f).sum::<f64>() / outcomes.len() as f64
        };
        let gain = mean(&|o| o.after - o.before);
        let (steps, cfg) = outcomes[0].sampling;
        let label = if cfg { format!("{steps}+CFG") } else { steps.to_string() };
        println!(
            "{algorithm:<14} {:>5} {:>6.0} {:>7.1}% {:>7.1}% {:>+7.1}  {:>+9.2}  {:>9.0} {label:>9} {:>9.2}",
            outcomes.len(),
            mean(&|o| o.steps),
            100.0 * mean(&|o| o.before),
            100.0 * mean(&|o| o.after),
            100.0 * gain,
            100.0 * mean(&|o| (o.after - o.before) / o.minutes),
            mean(&|o| o.ms_per_step),
            100.0 * mean(&|o| o.after) / steps as f64,
        );
    }
    println!(
        "(accuracy in %, gain in points, gain/min in points per minute of training; sampling: \
         denoising steps of a validation sample, acc/step: accuracy after training per step)"
    );
    Ok(())
}
