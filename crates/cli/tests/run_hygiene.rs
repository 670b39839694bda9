//! The run folder keeps what it must: resuming from an older checkpoint sets the newer ones
//! aside instead of deleting them, a damaged newest checkpoint is skipped with a warning, and
//! SIGTERM to `flowtune launch` stops both ranks at a saved step. Each ends in a state that
//! resumes bit for bit (LoRA and metrics) against a run that was never stopped.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{root, stdout};

/// A tiny SD3 pipeline for the whole binary.
fn model() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let d = flowtune_fixtures::shared!("hygiene-tiny");
        stdout(&common::flowtune(&["make-tiny", "sd3", &d.display().to_string()]));
        d
    })
}

/// `flowtune` with the `launch` arguments (none: one process), then `args`.
fn run_flowtune(launch: &[&str], args: &[String]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_flowtune"));
    c.current_dir(root()).env_remove("WORLD_SIZE").args(launch).args(args);
    c.output().expect("run flowtune")
}

/// `train` of the tiny recipe into `out` for `steps`, saving every step, with `extra`.
fn train_args(out: &Path, steps: u64, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "train".to_string(),
        "examples/flow_grpo_tiny.yaml".into(),
        format!("model.path={}", model().display()),
        "data.train_files=[examples/prompts/tiny.txt]".into(),
        format!("trainer.output_dir={}", out.display()),
        format!("trainer.total_steps={steps}"),
        "trainer.save_freq=1".into(),
        "reward.functions=[{name: brightness}]".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn ok(out: Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    stderr
}

fn lora(out: &Path) -> BTreeMap<String, tch::Tensor> {
    let file = out.join("lora/pytorch_lora_weights.safetensors");
    tch::Tensor::read_safetensors(file).unwrap().into_iter().collect()
}

fn metrics(out: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The same LoRA bits, and the same metrics (but timings) at every step.
fn assert_same_run(a: &Path, b: &Path) {
    let (la, lb) = (lora(a), lora(b));
    assert_eq!(la.keys().collect::<Vec<_>>(), lb.keys().collect::<Vec<_>>());
    for (name, t) in &la {
        assert!(t.equal(&lb[name]), "{name} differs");
    }
    let (ma, mb) = (metrics(a), metrics(b));
    assert_eq!(ma.len(), mb.len());
    for (x, y) in ma.iter().zip(&mb) {
        for (key, value) in x.as_object().unwrap() {
            if !["timing_s/", "perf/"].iter().any(|p| key.starts_with(p)) {
                assert_eq!(value, &y[key], "step {} {key}", x["step"]);
            }
        }
    }
}

fn step_dir(out: &Path, step: u64) -> PathBuf {
    out.join(format!("checkpoints/step_{step:06}"))
}

#[test]
fn resuming_an_older_checkpoint_sets_the_newer_aside_and_keeps_the_resumed_one() {
    let dir = flowtune_fixtures::scratch("hygiene-older");
    let (straight, run) = (dir.join("straight"), dir.join("run"));
    ok(run_flowtune(&[], &train_args(&straight, 4, &[])));
    ok(run_flowtune(&[], &train_args(&run, 4, &["trainer.keep_last=2"])));
    // Resuming step 3 while step 4 exists once deleted both (keep_last 2).
    let resume = format!("trainer.resume={}", step_dir(&run, 3).display());
    let said = ok(run_flowtune(&[], &train_args(&run, 4, &["trainer.keep_last=2", &resume])));
    assert!(said.contains("(after step 3) to "), "{said}");
    assert!(run.join("checkpoints/abandoned/step_000004/state.json").exists(), "{said}");
    assert!(step_dir(&run, 3).join("state.json").exists(), "the resumed checkpoint stays");
    assert!(step_dir(&run, 4).join("manifest.json").exists(), "the new step 4");
    assert!(!step_dir(&run, 2).exists(), "keep_last 2: steps 3 and 4");
    // The metrics log holds both step 4 lines: compare the weights.
    let (a, b) = (lora(&straight), lora(&run));
    for (name, t) in &a {
        assert!(t.equal(&b[name]), "{name} differs");
    }
}

/// The run folder keeps the resolved recipe; a resume that changes the math is refused by key
/// (before any step), unless allowed; one that changes only where or how long it runs goes on.
#[test]
fn a_resume_that_changes_the_math_is_refused_by_key() {
    let dir = flowtune_fixtures::scratch("hygiene-recipe");
    let run = dir.join("run");
    ok(run_flowtune(&[], &train_args(&run, 1, &[])));
    let kept = std::fs::read_to_string(run.join("recipe.resolved.yaml")).unwrap();
    assert!(kept.contains("total_steps: 1"), "{kept}");
    let out = run_flowtune(&[], &train_args(&run, 2, &["trainer.lr=0.5", "seed=3"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("recipe.resolved.yaml was trained with: seed: 42 → 3, trainer.lr: "));
    assert!(stderr.contains("set trainer.allow_recipe_change=true"), "{stderr}");
    assert_eq!(metrics(&run).len(), 1, "nothing ran");
    ok(run_flowtune(&[], &train_args(&run, 2, &["trainer.keep_last=5"])));
    let allowed = ["trainer.lr=0.5", "trainer.allow_recipe_change=true"];
    ok(run_flowtune(&[], &train_args(&run, 3, &allowed)));
    assert_eq!(metrics(&run).len(), 3);
}

#[test]
fn a_damaged_newest_checkpoint_is_skipped_and_the_run_resumes_bit_for_bit() {
    let dir = flowtune_fixtures::scratch("hygiene-damaged");
    let (straight, run) = (dir.join("straight"), dir.join("run"));
    ok(run_flowtune(&[], &train_args(&straight, 4, &[])));
    ok(run_flowtune(&[], &train_args(&run, 3, &["trainer.keep_last=3"])));
    let file = step_dir(&run, 3).join("optimizer.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    // Named explicitly, it is refused by name; `auto` skips it.
    let named = format!("trainer.resume={}", step_dir(&run, 3).display());
    let out = run_flowtune(&[], &train_args(&run, 4, &[&named]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("step_000003 is damaged: optimizer.safetensors has"), "{stderr}");
    let said = ok(run_flowtune(&[], &train_args(&run, 4, &["trainer.keep_last=3"])));
    let skipped = format!("warning: skipping checkpoint {}", step_dir(&run, 3).display());
    assert!(said.contains(&skipped) && said.contains("resumed from"), "{said}");
    assert!(said.contains("(step 2)"), "{said}");
    assert!(run.join("checkpoints/abandoned/step_000003").exists(), "set aside, not lost");
    assert_same_run(&straight, &run);
}

#[test]
fn sigterm_to_a_launched_job_saves_the_step_and_the_job_resumes_bit_for_bit() {
    let dir = flowtune_fixtures::scratch("hygiene-sigterm");
    let run = dir.join("run");
    let launch = ["launch", "--nproc", "2", "--"];
    let args = train_args(&run, 400, &["trainer.save_freq=0", "trainer.dist_timeout_s=60"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_flowtune"));
    child.current_dir(root()).env_remove("WORLD_SIZE").args(launch).args(&args);
    let child = child.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    while metrics_lines(&run) < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let kill = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    let done = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(!done.status.success(), "{stderr}");
    let steps = metrics_lines(&run) as u64;
    let stopped = format!("stopped by SIGTERM after step {steps}, with a checkpoint saved for it");
    assert!(stderr.contains(&stopped), "{stderr}");
    assert!(step_dir(&run, steps).join("manifest.json").exists());
    // The job resumes from it; a job never stopped gives the same bits.
    let extra = ["trainer.dist_timeout_s=60"];
    ok(run_flowtune(&launch, &train_args(&run, steps + 1, &extra)));
    let straight = dir.join("straight");
    ok(run_flowtune(&launch, &train_args(&straight, steps + 1, &extra)));
    assert_same_run(&straight, &run);
}

fn metrics_lines(out: &Path) -> usize {
    std::fs::read_to_string(out.join("metrics.jsonl")).map(|s| s.lines().count()).unwrap_or(0)
}

/// Checkpoints written before algorithms owned their state (`fixtures/checkpoints_before_seams`:
/// GARDO's gate and anchor, DiffusionNFT's old policy, at step 2 of 3) resume in today's binary
/// into the step 3 and the LoRA that the old binary's unbroken run gave, bit for bit.
#[test]
fn checkpoints_from_before_the_algorithm_seams_resume_bit_for_bit() {
    let fixtures = flowtune_fixtures::dir().join("checkpoints_before_seams");
    for recipe in ["gardo_tiny", "diffusion_nft_tiny"] {
        let before = fixtures.join(recipe);
        let out = flowtune_fixtures::scratch(&format!("hygiene-before-seams-{recipe}"));
        let ckpt = step_dir(&out, 2);
        std::fs::create_dir_all(&ckpt).unwrap();
        for entry in std::fs::read_dir(before.join("step_000002")).unwrap().flatten() {
            std::fs::copy(entry.path(), ckpt.join(entry.file_name())).unwrap();
        }
        let lines = std::fs::read_to_string(before.join("metrics.jsonl")).unwrap();
        let lines: Vec<&str> = lines.lines().collect();
        std::fs::write(out.join("metrics.jsonl"), format!("{}\n", lines[..2].join("\n"))).unwrap();
        let args: Vec<String> = vec![
            "train".into(),
            format!("examples/{recipe}.yaml"),
            format!("model.path={}", model().display()),
            format!("trainer.output_dir={}", out.display()),
            "trainer.total_steps=3".into(),
            "trainer.save_freq=1".into(),
            "trainer.keep_last=5".into(),
            // The old binary ran each projection apart: fused ones round differently.
            "model.fused_projections=false".into(),
        ];
        assert!(ok(run_flowtune(&[], &args)).contains("(step 2)"), "{recipe} resumed at step 2");
        let then: BTreeMap<String, tch::Tensor> =
            tch::Tensor::read_safetensors(before.join("pytorch_lora_weights.safetensors"))
                .unwrap()
                .into_iter()
                .collect();
        let now = lora(&out);
        assert_eq!(then.keys().collect::<Vec<_>>(), now.keys().collect::<Vec<_>>());
        for (name, t) in &then {
            assert!(t.equal(&now[name]), "{recipe}: {name} differs");
        }
        let (then, now): (serde_json::Value, _) =
            (serde_json::from_str(lines[2]).unwrap(), metrics(&out).pop().unwrap());
        assert_eq!(now["step"], 3);
        let mut compared = 0;
        for (key, value) in then.as_object().unwrap() {
            if !["timing_s/", "perf/"].iter().any(|p| key.starts_with(p)) {
                assert_eq!(value, &now[key], "{recipe}: step 3 {key}");
                compared += 1;
            }
        }
        assert!(compared > 20, "{recipe}: {compared} metrics compared");
    }
}
