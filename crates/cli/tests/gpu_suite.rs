//! The GPU suite on the CPU: `bench step --random-weights` at real width (the real Qwen-Image
//! config, 2 blocks) against `flowtune plan`, and `scripts/gpu/suite.sh --tiny` running every part.

use std::path::PathBuf;
use std::process::{Command, Output};

use flowtune_fixtures::scratch;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn flowtune(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flowtune"))
        .args(args)
        .current_dir(root())
        .env_remove("WORLD_SIZE")
        .output()
        .expect("run flowtune")
}

fn ok(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    text
}

/// Two LoRA steps of Qwen-Image's real config at 2 blocks from random weights, f32 at 128² with
/// stand-in prompts of 16 tokens: every phase timed, model work counted in rollout and update, and
/// the process's peak above its resident memory before loading within 15 % of the plan.
#[test]
fn bench_step_with_random_weights_reports_phases_and_matches_the_plan() {
    let dir = scratch("bench-step");
    let json = dir.join("step.json");
    ok(&flowtune(&[
        "bench",
        "step",
        "examples/flow_grpo_qwen_image.yaml",
        "--random-weights",
        "--layers",
        "2",
        "--text-tokens",
        "16",
        "model.path=examples/models/qwen-image",
        "model.resolution=128",
        "model.dtype=f32",
        "model.frozen_dtype=f32",
        "data.prompts_per_step=1",
        "rollout.n=2",
        "rollout.steps=3",
        "rollout.sde_window_range=[0,2]",
        "trainer.micro_batch_size=2",
        "--json",
        json.to_str().unwrap(),
    ]));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for phase in ["step", "gen", "reward", "old_log_prob", "update_actor"] {
        assert!(r["seconds"][phase].as_f64().is_some_and(|s| s >= 0.0), "{phase}: {r}");
    }
    assert!(r["images_per_s_per_gpu"].as_f64().unwrap() > 0.0);
    // 128² → 8 × 8 packed image tokens beside the 16 joint text tokens.
    assert_eq!(r["tokens_per_sample"], 80);
    assert_eq!(r["shape"]["samples_per_rank"], 2);
    assert_eq!(r["shape"]["micro_steps"], 2, "2 window steps × one micro-batch of 2");
    for phase in ["rollout", "update"] {
        assert!(r["tflops"][phase].as_f64().unwrap() > 0.0, "{phase}: {}", r["tflops"]);
    }
    let ratio = r["memory_gib"]["measured_over_plan"].as_f64().unwrap();
    eprintln!(
        "measured {} GiB, planned {} GiB",
        r["memory_gib"]["measured"], r["memory_gib"]["planned"]
    );
    assert!((ratio - 1.0).abs() <= 0.15, "measured / plan = {ratio}: {}", r["memory_gib"]);
}

#[test]
fn bench_step_refuses_layers_without_random_weights() {
    let out = flowtune(&["bench", "step", "examples/flow_grpo_tiny.yaml", "--layers", "2"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--layers needs --random-weights"), "{err}");
}
