//! The GPU suite on the CPU: `bench step --random-weights` at real width (the real Qwen-Image
//! config, 2 blocks) against `flowtune plan`, and `scripts/gpu/suite.sh --tiny` running every part.

mod common;

use std::process::Command;

use common::{flowtune, root, stdout as ok};
use flowtune_fixtures::scratch;

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
    assert!(r["setup_seconds"].as_f64().unwrap() > 0.0);
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

/// `bench step --pictures`: every prompt names a condition picture, which random weights encode
/// with the pipeline's VAE beside stand-in prompts; the plan counts its tokens. FLUX.2 [klein]'s
/// real config, one block of each kind, a 64² target and a 128² reference: 16 target, 64
/// reference and 16 text tokens.
#[test]
fn bench_step_with_condition_pictures_counts_them_in_the_plan() {
    let dir = scratch("bench-step-pictures");
    let json = dir.join("step.json");
    ok(&flowtune(&[
        "bench",
        "step",
        "examples/flow_grpo_flux2.yaml",
        "--random-weights",
        "--layers",
        "1",
        "--text-tokens",
        "16",
        "--pictures",
        "128x128",
        "model.path=examples/models/flux.2-klein-base-4b",
        "model.resolution=64",
        "model.dtype=f32",
        "model.frozen_dtype=f32",
        "data.prompts_per_step=1",
        "rollout.n=2",
        "rollout.steps=2",
        "rollout.sde_window_size=1",
        "rollout.sde_window_range=[0,1]",
        "trainer.micro_batch_size=2",
        "--json",
        json.to_str().unwrap(),
    ]));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r["tokens_per_sample"], 16 + 64 + 16, "{r}");
    assert!(r["images_per_s_per_gpu"].as_f64().unwrap() > 0.0, "{r}");
    let ratio = r["memory_gib"]["measured_over_plan"].as_f64().unwrap();
    assert!((ratio - 1.0).abs() <= 0.15, "measured / plan = {ratio}: {}", r["memory_gib"]);
    let bad = flowtune(&["bench", "step", "examples/flow_grpo_tiny.yaml", "--pictures", "64y64"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("expected WIDTHxHEIGHT"));
}

#[test]
fn bench_step_refuses_layers_without_random_weights() {
    let out = flowtune(&["bench", "step", "examples/flow_grpo_tiny.yaml", "--layers", "2"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--layers needs --random-weights"), "{err}");
}

/// `scripts/gpu/suite.sh --tiny`: every part runs on the CPU with tiny configs and lands in the
/// JSON — parity cases within their tolerances and a launched one-rank job, whole steps of Qwen-Image,
/// Wan, FLUX.2 and LTX-2.3 with sound from random weights, both diffusers anchors with their ratios, the activation
/// constants of every block the planner knows (`make setup` installs diffusers for the anchors),
/// Qwen-Image's step again with the throughput items off, and its rewards scored beside sampling
/// against a reward server that answers late.
#[test]
fn the_suite_runs_every_part_in_tiny_mode() {
    let out = scratch("gpu-suite");
    let venv = std::env::var("VIRTUAL_ENV").expect("the torch venv (source scripts/env.sh)");
    let cache = std::env::var("FLOWTUNE_CACHE").expect("FLOWTUNE_CACHE (source scripts/env.sh)");
    let run = Command::new("bash")
        .args(["scripts/gpu/suite.sh", "--tiny", "--out", out.to_str().unwrap()])
        .current_dir(root())
        .env("FLOWTUNE_BIN", env!("CARGO_BIN_EXE_flowtune"))
        .env("PYTHON", format!("{venv}/bin/python"))
        .env("PYTHONPATH", format!("{cache}/anchors"))
        .env_remove("WORLD_SIZE")
        .output()
        .expect("run the suite");
    ok(&run);
    let file = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .expect("the suite's JSON");
    assert!(file.file_name().unwrap().to_str().unwrap().ends_with("-cpu-tiny.json"), "{file:?}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let parts = &r["parts"];
    for key in ["a", "b", "c", "d", "e", "f", "g", "h", "i"] {
        assert_eq!(parts[key]["status"], "ok", "part {key}: {}", parts[key]);
    }
    let cases = parts["b"]["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 9, "5 f32 + 3 bf16 forwards and the launch");
    assert!(cases.iter().all(|c| c["ok"] == true), "{cases:?}");
    for c in &cases[..8] {
        assert!(c["error"].as_f64().unwrap() <= c["tolerance"].as_f64().unwrap(), "{c}");
    }
    let steps =
        [&parts["c"]["qwen_image"], &parts["f"]["wan"], &parts["f"]["flux2"], &parts["h"]["ltx2"]];
    for step in steps.into_iter().chain([&parts["g"]["qwen_image"]]) {
        assert!(step["images_per_s_per_gpu"].as_f64().unwrap() > 0.0, "{step}");
        assert_eq!(step["random_weights"], true);
    }
    for ratio in ["rollout_speedup_vs_diffusers", "update_speedup_vs_diffusers"] {
        assert!(parts["d"][ratio].as_f64().is_some_and(|x| x > 0.0), "{ratio}: {}", parts["d"]);
    }
    assert_eq!(parts["d"]["rollout"]["pipeline"], "QwenImagePipeline");
    assert_eq!(parts["d"]["train"]["gradient_checkpointing"], true);
    let constants = parts["e"]["constants"]["constants"].as_object().unwrap();
    assert_eq!(constants.len(), 8, "{constants:?}");
    for (block, c) in constants {
        assert!(c["bf16"].as_f64().unwrap() > 0.0 && c["f32"].as_f64().unwrap() > 0.0, "{block}");
    }
    let rows = std::fs::read_to_string(file.with_extension("md")).unwrap();
    assert!(parts["g"]["items_speedup"].as_f64().is_some_and(|x| x > 0.0), "{}", parts["g"]);
    // Part i scored every chunk against the delayed reward server, both ways, with the same scores.
    let overlap = &parts["i"]["reward_overlap"];
    assert_eq!(overlap["rewards_identical"], true, "{overlap}");
    assert!(overlap["scoring_s"].as_f64().is_some_and(|s| s >= 4.0 * 0.05), "{overlap}");
    assert!(overlap["hidden_fraction"].as_f64().is_some(), "{overlap}");
    assert_eq!(rows.lines().filter(|l| l.starts_with("| 2")).count(), 9, "{rows}");
}

/// `plan --constants`: measured activation constants replace the built-in ones by block name (a
/// Qwen-Image block saving twice the bytes doubles the activations of a step without
/// checkpointing); a file without positive numbers is refused by name.
#[test]
fn plan_takes_measured_activation_constants() {
    let dir = scratch("plan-constants");
    let activations = |extra: &[&str]| {
        let mut args = vec![
            "plan",
            "examples/flow_grpo_qwen_image.yaml",
            "model.path=examples/models/qwen-image",
            // Without recomputation the activations scale with the constants exactly.
            "trainer.gradient_checkpointing=false",
            "--gpus",
            "8",
            "--json",
        ];
        args.extend(extra);
        let r: serde_json::Value = serde_json::from_str(&ok(&flowtune(&args))).unwrap();
        let items = r["items"].as_array().unwrap().clone();
        let item = items.iter().find(|i| i["item"].as_str().unwrap().starts_with("activations ("));
        item.expect("an activations item")["bytes"].as_f64().unwrap()
    };
    let file = dir.join("constants.json");
    let measured =
        r#"{"device": "test", "constants": {"qwen_image": {"bf16": 112.6, "f32": 192.8}}}"#;
    std::fs::write(&file, measured).unwrap();
    let (built_in, doubled) =
        (activations(&[]), activations(&["--constants", file.to_str().unwrap()]));
    assert!((doubled / built_in - 2.0).abs() < 1e-9, "{built_in} → {doubled}");
    std::fs::write(&file, r#"{"constants": {"qwen_image": {"bf16": -1}}}"#).unwrap();
    let out = flowtune(&[
        "plan",
        "examples/flow_grpo_qwen_image.yaml",
        "model.path=examples/models/qwen-image",
        "--constants",
        file.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("constants.qwen_image: expected positive"),
        "{err}"
    );
}
