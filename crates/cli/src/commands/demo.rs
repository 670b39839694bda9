//! `flowtune demo`: FlowGRPO with LoRA on the shipped shapes base model, validated before and
//! after, leaving pictures (before/after grids, the reward curve), a per-category table and
//! `summary.json` in the output folder.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, Context};
use clap::Args;
use flowtune_config::Recipe;
use flowtune_report::{line_plot, Series};
use flowtune_shapes::Category;
use flowtune_trainer::{train, TrainError};

use crate::device::DeviceArg;
use crate::Failure;

#[derive(Args)]
pub struct DemoArgs {
    /// The recipe to run.
    #[arg(long, default_value = "examples/shapes/flow_grpo.yaml")]
    recipe: PathBuf,
    /// Output folder (replaced).
    #[arg(long, default_value = "runs/demo")]
    out: PathBuf,
    /// The run's seed (sampling noise, data order, adapter initialisation).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// More recipe overrides like `trainer.total_steps=10`.
    overrides: Vec<String>,
}

/// Accuracy per category and overall from one validation's metrics.
fn accuracies(m: &serde_json::Value) -> (f64, BTreeMap<String, f64>) {
    let per: BTreeMap<String, f64> = Category::ALL
        .iter()
        .filter_map(|c| {
            let v = m[format!("val-core/shapes/{}/acc", c.name())].as_f64()?;
            Some((c.name().to_string(), v))
        })
        .collect();
    (m["val-core/shapes/reward/mean@1"].as_f64().unwrap_or(f64::NAN), per)
}

pub fn run(a: DemoArgs, device: &DeviceArg) -> Result<(), Failure> {
    let mut overrides = a.overrides.clone();
    overrides.extend([
        format!("seed={}", a.seed),
        format!("trainer.output_dir={}", a.out.display()),
        "trainer.val_before_train=true".into(),
        "trainer.resume=none".into(),
    ]);
    let recipe = Recipe::load(&a.recipe, &overrides).map_err(Failure::input)?;
    let device = device.resolve()?;
    if a.out.exists() {
        std::fs::remove_dir_all(&a.out)
            .with_context(|| format!("clearing {}", a.out.display()))
            .map_err(Failure::Runtime)?;
    }
    let start = Instant::now();
    train(&recipe, device).map_err(|e| match e {
        TrainError::Invalid(_) | TrainError::Model(_) | TrainError::Data(_) => Failure::input(e),
        other => Failure::Runtime(other.into()),
    })?;
    let wall_seconds = start.elapsed().as_secs_f64();
    report(&a.out, a.seed, wall_seconds).map_err(Failure::Runtime)
}

/// Turns the run's metrics and validation grids into the demo's outputs.
fn report(out: &Path, seed: u64, wall_seconds: f64) -> anyhow::Result<()> {
    let path = out.join("metrics.jsonl");
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&path)
        .with_context(|| path.display().to_string())?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .with_context(|| path.display().to_string())?;
    let validations: Vec<&serde_json::Value> =
        lines.iter().filter(|m| m.get("val-core/shapes/reward/mean@1").is_some()).collect();
    let (Some(first), Some(last)) = (validations.first(), validations.last()) else {
        return Err(anyhow!("{}: no shapes validation was logged", path.display()));
    };
    let step_of = |m: &serde_json::Value| m["step"].as_u64().unwrap_or(0);
    for (name, m) in [("before.png", first), ("after.png", last)] {
        let grid = out.join(format!("images/val_step_{:06}.png", step_of(m)));
        std::fs::copy(&grid, out.join(name)).with_context(|| grid.display().to_string())?;
    }
    let train_reward: Vec<(f64, f64)> = lines
        .iter()
        .filter_map(|m| Some((step_of(m) as f64, m.get("critic/rewards/mean")?.as_f64()?)))
        .collect();
    let val_accuracy: Vec<(f64, f64)> =
        validations.iter().map(|m| (step_of(m) as f64, accuracies(m).0)).collect();
    let plot = line_plot(
        &[
            Series { label: "train reward".into(), colour: [31, 119, 180], points: train_reward },
            Series {
                label: "validation accuracy".into(),
                colour: [214, 39, 40],
                points: val_accuracy,
            },
        ],
        "shapes_geneval",
        "step",
        "reward",
        640,
        400,
    );
    plot.save(out.join("reward_curve.png")).context("reward_curve.png")?;

    let (before, before_per) = accuracies(first);
    let (after, after_per) = accuracies(last);
    println!("\n{:<14} {:>8} {:>8}", "category", "before", "after");
    let mut per_category = serde_json::Map::new();
    for (name, b) in &before_per {
        let a = after_per.get(name).copied().unwrap_or(f64::NAN);
        println!("{name:<14} {:>7.1}% {:>7.1}%", 100.0 * b, 100.0 * a);
        per_category.insert(name.clone(), serde_json::json!({ "before": b, "after": a }));
    }
    println!("{:<14} {:>7.1}% {:>7.1}%", "overall", 100.0 * before, 100.0 * after);
    println!("wall time {wall_seconds:.0} s; pictures and summary.json in {}", out.display());
    let summary = serde_json::json!({
        "accuracy_before": before,
        "accuracy_after": after,
        "per_category": per_category,
        "wall_seconds": wall_seconds,
        "seed": seed,
        "steps": step_of(last),
    });
    let file = out.join("summary.json");
    std::fs::write(&file, serde_json::to_string_pretty(&summary)? + "\n")
        .with_context(|| file.display().to_string())
}
