//! Sharded loads read only each rank's slices: a Qwen-Image pipeline with its transformer at real
//! width (3072, three blocks: 2 GB in bf16) loads whole in one process and with
//! `trainer.sharding: frozen` on 2 and 4 ranks. The rise of every rank's resident memory while
//! loading falls with the ranks, each within 15 % of `flowtune plan`'s loading figure.

mod common;

use std::path::Path;
use std::process::Command;

use common::{flowtune, root, stdout};

/// One training step of the tiny recipe on `model`: no guidance, two steps, no checkpoints.
fn overrides(model: &Path, out: &Path, ranks: usize) -> Vec<String> {
    let prompts = root().join("examples/prompts/tiny.txt");
    let mut o: Vec<String> = [
        "trainer.total_steps=1",
        "model.dtype=bf16",
        "model.resolution=32",
        "reward.functions=[{name: brightness}]",
        "data.prompts_per_step=4",
        "rollout.steps=2",
        "rollout.eval_steps=2",
        "rollout.guidance_scale=1.0",
        "trainer.ppo_mini_batch_size=8",
        "trainer.micro_batch_size=4",
        "trainer.save_freq=0",
        "trainer.dist_timeout_s=120",
    ]
    .map(String::from)
    .to_vec();
    o.push(format!("model.path={}", model.display()));
    o.push(format!("data.train_files=[{}]", prompts.display()));
    o.push(format!("trainer.output_dir={}", out.display()));
    if ranks > 1 {
        o.push("trainer.sharding=frozen".into());
    }
    o
}

const RECIPE: &str = "examples/flow_grpo_qwen_image_tiny.yaml";

/// Every rank's `load_rss_rise_gb` of a run on `ranks` ranks.
fn load_rises(model: &Path, out: &Path, ranks: usize) -> Vec<f64> {
    let mut c = Command::new(env!("CARGO_BIN_EXE_flowtune"));
    c.current_dir(root()).env_remove("WORLD_SIZE");
    c.args(["launch", "--nproc", &ranks.to_string(), "--", "train", RECIPE]);
    let run = c.args(overrides(model, out, ranks)).output().expect("run flowtune");
    let err = String::from_utf8_lossy(&run.stderr).to_string();
    assert!(run.status.success(), "{ranks} ranks:\n{err}");
    let rises: Vec<f64> = err
        .lines()
        .filter_map(|l| l.split("load_rss_rise_gb=").nth(1))
        .map(|v| v.split(',').next().unwrap().trim().parse().expect("GiB"))
        .collect();
    assert_eq!(rises.len(), ranks, "one load line per rank:\n{err}");
    rises
}

/// `flowtune plan`'s loading figure for `ranks` ranks, in GiB.
fn planned(model: &Path, out: &Path, ranks: usize) -> f64 {
    let mut args = vec!["plan".to_string(), RECIPE.into()];
    args.extend(overrides(model, out, ranks));
    args.extend(["--gpus".into(), ranks.to_string(), "--json".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let plan: serde_json::Value = serde_json::from_str(&stdout(&flowtune(&args))).expect("JSON");
    plan["load_gib"].as_f64().expect("load_gib")
}

#[test]
fn sharded_ranks_load_their_slices_only_as_planned() {
    let dir = flowtune_fixtures::scratch("sharded-load");
    let model = dir.join("qwen-image");
    let config = root().join("examples/models/qwen-image/transformer/config.json");
    let (config, model_arg) = (config.display().to_string(), model.display().to_string());
    let made = flowtune(&[
        "make-tiny",
        "qwen-image",
        &model_arg,
        "--config",
        &config,
        "--layers",
        "3",
        "--dtype",
        "bf16",
    ]);
    stdout(&made);
    let mut previous = f64::INFINITY;
    for ranks in [1, 2, 4] {
        let out = dir.join(format!("run-{ranks}"));
        let rises = load_rises(&model, &out, ranks);
        let plan = planned(&model, &out, ranks);
        for rise in &rises {
            let off = (rise - plan).abs() / plan;
            eprintln!(
                "{ranks} rank(s): load rise {rise:.3} GiB, plan {plan:.3} GiB ({off:.1e} off)"
            );
            assert!(off <= 0.15, "{ranks} ranks: {rise:.3} GiB vs the plan's {plan:.3}");
        }
        let most = rises.iter().copied().fold(0.0, f64::max);
        assert!(most < previous, "{ranks} ranks load {most:.3} GiB, no less than before");
        previous = most;
    }
}
