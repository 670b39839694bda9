//! `flowtune demo`: FlowGRPO with LoRA on the shipped shapes base model, validated before and
//! after, leaving pictures (before/after grids, the reward curve), a per-category table and
//! `summary.json` in the output folder; the held-out prompts (`--heldout`) are validated beside
//! the recipe's and reported on their own.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use flowtune_config::Recipe;
use flowtune_report::{line_plot, Series};
use flowtune_trainer::train;

use super::shapes_log::{RunLog, HELDOUT_SOURCE};
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
    /// Prompts validated beside the recipe's (data source `shapes_heldout`): drawn with a seed
    /// no setting was tuned on (`flowtune shapes prompts --seed 20261127 --source shapes_heldout`).
    #[arg(long, default_value = "examples/shapes/heldout.jsonl")]
    heldout: PathBuf,
    /// More recipe overrides like `trainer.total_steps=10`.
    overrides: Vec<String>,
}

pub fn run(a: DemoArgs, device: &DeviceArg) -> Result<(), Failure> {
    let mut overrides = a.overrides.clone();
    overrides.extend([
        format!("seed={}", a.seed),
        format!("trainer.output_dir={}", a.out.display()),
        "trainer.val_before_train=true".into(),
        "trainer.resume=none".into(),
    ]);
    let mut recipe = Recipe::load(&a.recipe, &overrides).map_err(Failure::input)?;
    recipe.data.val_files.push(a.heldout.clone());
    let device = device.resolve()?;
    if a.out.exists() {
        std::fs::remove_dir_all(&a.out)
            .with_context(|| format!("clearing {}", a.out.display()))
            .map_err(Failure::Runtime)?;
    }
    let start = Instant::now();
    train(&recipe, device).map_err(Failure::training)?;
    let wall_seconds = start.elapsed().as_secs_f64();
    report(&a.out, a.seed, wall_seconds).map_err(Failure::Runtime)
}

/// Turns the run's metrics and validation grids into the demo's outputs.
fn report(out: &Path, seed: u64, wall_seconds: f64) -> anyhow::Result<()> {
    let log = RunLog::read(out)?;
    let (first, last) = log.before_after();
    for (name, v) in [("before.png", first), ("after.png", last)] {
        let grid = out.join(format!("images/val_step_{:06}.png", v.step));
        std::fs::copy(&grid, out.join(name)).with_context(|| grid.display().to_string())?;
    }
    let val_accuracy: Vec<(f64, f64)> =
        log.validations.iter().map(|v| (v.step as f64, v.accuracy)).collect();
    let reward = log.series("critic/rewards/mean");
    // The trailing 10-step mean: one step's reward is noisy (new prompts every step).
    let smoothed: Vec<(f64, f64)> = (0..reward.len())
        .map(|i| {
            let window = &reward[i.saturating_sub(9)..=i];
            (reward[i].0, window.iter().map(|p| p.1).sum::<f64>() / window.len() as f64)
        })
        .collect();
    let plot = line_plot(
        &[
            Series { label: "train reward".into(), colour: [174, 199, 232], points: reward },
            Series {
                label: "train reward, 10-step mean".into(),
                colour: [31, 119, 180],
                points: smoothed,
            },
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

    println!("\n{:<14} {:>8} {:>8}", "category", "before", "after");
    let mut per_category = serde_json::Map::new();
    for (name, b) in &first.per_category {
        let a = last.per_category.get(name).copied().unwrap_or(f64::NAN);
        println!("{name:<14} {:>7.1}% {:>7.1}%", 100.0 * b, 100.0 * a);
        per_category.insert(name.clone(), serde_json::json!({ "before": b, "after": a }));
    }
    println!("{:<14} {:>7.1}% {:>7.1}%", "overall", 100.0 * first.accuracy, 100.0 * last.accuracy);
    println!(
        "colour entropy where the prompt names no colour: {:.2} → {:.2} bits (uniform {:.2})",
        first.color_entropy,
        last.color_entropy,
        5f64.log2()
    );
    let heldout = match (log.heldout.first(), log.heldout.last()) {
        (Some(b), Some(a)) => {
            println!(
                "held-out prompts ({HELDOUT_SOURCE}): {:.1}% → {:.1}%",
                100.0 * b.accuracy,
                100.0 * a.accuracy
            );
            serde_json::json!({ "before": b.accuracy, "after": a.accuracy })
        }
        _ => serde_json::Value::Null,
    };
    println!("wall time {wall_seconds:.0} s; pictures and summary.json in {}", out.display());
    let summary = serde_json::json!({
        "accuracy_before": first.accuracy,
        "accuracy_after": last.accuracy,
        "per_category": per_category,
        "color_entropy_before": first.color_entropy,
        "color_entropy_after": last.color_entropy,
        "heldout_accuracy": heldout,
        "wall_seconds": wall_seconds,
        "seed": seed,
        "steps": last.step,
    });
    let file = out.join("summary.json");
    std::fs::write(&file, serde_json::to_string_pretty(&summary)? + "\n")
        .with_context(|| file.display().to_string())
}
