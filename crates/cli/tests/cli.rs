//! The `flowtune` binary end to end: outputs and bad-input behaviour (one error line, exit 2).

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

use flowtune_fixtures::scratch;

fn flowtune(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flowtune")).args(args).output().expect("run flowtune")
}

fn repo(path: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.join(path).display().to_string()
}

/// A path in the fixtures folder (`FLOWTUNE_FIXTURES`, else the project's `fixtures/`).
fn in_fixtures(path: &str) -> String {
    flowtune_fixtures::dir().join(path).display().to_string()
}

/// A file `name` holding `text`, in a folder this binary's tests share; returns its path.
fn text_file(name: &str, text: &str) -> String {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let d = flowtune_fixtures::shared!("files");
        std::fs::create_dir_all(&d).unwrap();
        d
    });
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// A safetensors file's tensors by name.
fn tensors(path: impl AsRef<std::path::Path>) -> std::collections::HashMap<String, tch::Tensor> {
    tch::Tensor::read_safetensors(path).unwrap().into_iter().collect()
}

/// Asserts exit code 2 and a single `error:` line on stderr containing every needle.
fn assert_bad_input(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one error line expected, got: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"), "{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "`{n}` missing from: {stderr}");
    }
}

#[test]
fn env_reports_torch_and_devices() {
    let out = flowtune(&["env"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for key in [
        "torch: 2.11.0",
        "cuda available: ",
        "cuda devices: ",
        "threads: ",
        "device: cpu (matmul check passed)",
    ] {
        assert!(stdout.contains(key), "`{key}` missing from:\n{stdout}");
    }
}

/// libgomp's wait policy is set before it loads (the binary re-executes itself), and a user's
/// own setting wins; `--threads` sets the intra-op threads.
#[test]
fn openmp_workers_sleep_unless_the_environment_says_how_to_wait() {
    let env = |vars: &[(&str, &str)]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_flowtune"));
        c.env_remove("OMP_WAIT_POLICY").env_remove("GOMP_SPINCOUNT");
        c.envs(vars.iter().copied()).args(["--threads", "1", "env"]);
        let out = c.output().expect("run flowtune");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let default = env(&[]);
    assert!(default.contains("OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=unset"), "{default}");
    assert!(default.contains("threads: 1\n"), "{default}");
    let own = env(&[("GOMP_SPINCOUNT", "1000")]);
    assert!(own.contains("OMP_WAIT_POLICY=unset GOMP_SPINCOUNT=1000"), "{own}");
    let zero = flowtune(&["--threads", "0", "env"]);
    assert_eq!(zero.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&zero.stderr).contains("at least 1, got \"0\""));
}

#[test]
fn schedule_prints_grid_json() {
    let out = flowtune(&[
        "debug",
        "schedule",
        "--scheduler-config",
        &repo("examples/schedulers/qwen_image.json"),
        "--steps",
        "10",
        "--image-seq-len",
        "1024",
        "--pipeline",
        "qwen_image",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["sigmas"].as_array().unwrap().len(), 11);
    assert_eq!(v["timesteps"].as_array().unwrap().len(), 10);
    assert!((v["mu"].as_f64().unwrap() - 0.538_709_677_419_354_8).abs() < 1e-12);
    let last = v["sigmas"][9].as_f64().unwrap();
    assert!((last - 0.02).abs() < 1e-6, "shift_terminal stretches the last sigma to 0.02: {last}");
}

#[test]
fn config_show_resolves_overrides() {
    let out = flowtune(&[
        "config",
        "show",
        &repo("examples/flow_grpo_sd35.yaml"),
        "rollout.noise_level=0.9",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("noise_level: 0.9") && stdout.contains("algorithm: flow_grpo"),
        "{stdout}"
    );
}

#[test]
fn bad_input_gives_one_clear_line_and_exit_2() {
    let recipe = repo("examples/flow_grpo_sd35.yaml");
    assert_bad_input(
        &flowtune(&["config", "show", &text_file("unknown.yaml", "rollout:\n  stepz: 3\n")]),
        &["unknown.yaml: rollout: unknown field `stepz` at line 2 column 3; did you mean `steps`?"],
    );
    assert_bad_input(
        &flowtune(&["config", "show", &recipe, "rollout.steps=ten"]),
        &["override `rollout.steps=ten`", "invalid type: string \"ten\""],
    );
    assert_bad_input(
        &flowtune(&["config", "show", &recipe, "rollout.sde_type=foo"]),
        &["rollout.sde_type: unknown variant `foo`, expected one of `sde`, `cps`, `dance_sde`"],
    );
    assert_bad_input(
        &flowtune(&["config", "show", &recipe, "rollout.noise_level=-0.5"]),
        &["rollout.noise_level: -0.5 is not allowed; expected a finite number ≥ 0"],
    );
    assert_bad_input(
        &flowtune(&["config", "show", &recipe, "algorithm=ppo"]),
        &["unknown algorithm `ppo`; known: flow_grpo, dance_grpo, mix_grpo, grpo_guard"],
    );
    assert_bad_input(
        &flowtune(&[
            "debug",
            "schedule",
            "--scheduler-config",
            &repo("examples/schedulers/sd35_medium.json"),
            "--steps",
            "10",
            "--timestep",
            "500",
        ]),
        &["timestep 500.0 is not on the sampling grid", "nearest is 464.87604 (step 7)"],
    );
    assert_bad_input(
        &flowtune(&["debug", "schedule", "--scheduler-config", "/no/such.json", "--steps", "4"]),
        &["cannot read /no/such.json"],
    );
    assert_bad_input(&flowtune(&["--device", "cuda:7", "env"]), &["--device cuda:7"]);
}

/// `debug forward` on fixture `name` with its LoRA (scaled by `alpha`) reproduces the fixture's
/// `output.sample_with_lora` (1e-3 relative).
fn check_forward_with_lora(name: &str, alpha: &str) {
    let dir = scratch(&format!("forward-{name}"));
    let out = dir.join("out.safetensors");
    let io = in_fixtures(&format!("{name}_io.safetensors"));
    let run = flowtune(&[
        "debug",
        "forward",
        "--component",
        &in_fixtures(name),
        "--inputs",
        &io,
        "--out",
        &out.display().to_string(),
        "--lora",
        &in_fixtures(&format!("{name}_lora.safetensors")),
        "--lora-alpha",
        alpha,
    ]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let (got, want) = (tensors(&out), tensors(&io));
    let (g, w) = (&got["output.sample_with_lora"], &want["output.sample_with_lora"]);
    let rel = (g - w).norm().double_value(&[]) / w.norm().double_value(&[]);
    assert!(rel < 1e-3, "{name}: relative error {rel}");
}

/// Wan's transformer runs with its LoRA on a per-token-timestep fixture.
#[test]
fn debug_forward_runs_wan() {
    check_forward_with_lora("wan_ti2v_tiny", "6");
}

/// FLUX.2's transformer runs with its LoRA on the [klein] fixture (reference-image tokens) and
/// the [dev] one (its guidance embedding reads `guidance`).
#[test]
fn debug_forward_runs_flux2() {
    check_forward_with_lora("flux2_klein_tiny", "8");
    check_forward_with_lora("flux2_dev_tiny", "6");
}

/// Qwen-Image 2.1's transformer runs with its LoRA on the fixture with a condition image and a
/// masked prompt.
#[test]
fn debug_forward_runs_qwen_image21() {
    check_forward_with_lora("qwen_image21_tiny", "8");
}

/// `bench transformer` and `bench rollout` time video clips (the report names the latent and
/// pixel frames); a picture transformer refuses `--frames`.
#[test]
fn bench_times_wan_clips_and_refuses_frames_for_pictures() {
    let wan = in_fixtures("wan_pipeline");
    let component = format!("{wan}/transformer");
    let small = ["--batch", "1", "--iters", "1"];
    let transformer = flowtune(
        &[
            &["bench", "transformer", "--component", &component, "--latent", "4", "--frames", "3"],
            &small[..],
            &["--text-len", "5", "--lora-rank", "2"],
        ]
        .concat(),
    );
    let stdout = stdout_of(&transformer);
    assert!(stdout.contains("batch 1 × 3 frames × 4² latents"), "{stdout}");
    assert_eq!(stdout.matches("image tokens/s").count(), 2, "{stdout}");
    let args = ["bench", "rollout", "--model", &wan, "--steps", "2", "--resolution", "32"];
    let rollout = flowtune(&[&args[..], &small[..], &["--num-frames", "5"]].concat());
    let stdout = stdout_of(&rollout);
    assert!(stdout.contains("at 32px, 5 frames") && stdout.contains("samples/s"), "{stdout}");
    let sd3 = in_fixtures("sd3_tiny");
    let refused = ["bench", "transformer", "--component", &sd3, "--latent", "8", "--frames", "2"];
    assert_bad_input(&flowtune(&[&refused[..], &small[..]].concat()), &["--frames 2", "pictures"]);
}

#[test]
fn debug_forward_reproduces_the_fixture_outputs() {
    check_forward_with_lora("sd3_tiny", "8");
    assert_bad_input(
        &flowtune(&[
            "debug",
            "forward",
            "--component",
            &in_fixtures(""),
            "--inputs",
            "x",
            "--out",
            "y",
        ]),
        &["cannot read", "x"],
    );
}

#[test]
fn make_tiny_then_sample_writes_pngs() {
    let root = scratch("cli-sample");
    let (model, out) = (root.join("tiny"), root.join("samples"));
    let made = flowtune(&["make-tiny", "sd3", &model.display().to_string(), "--seed", "5"]);
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let run = flowtune(&[
        "sample",
        "--model",
        &model.display().to_string(),
        "--prompts",
        &repo("examples/prompts/tiny.txt"),
        "--steps",
        "3",
        "--resolution",
        "32",
        "--out",
        &out.display().to_string(),
    ]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    for i in 0..4 {
        let img = image_size(&out.join(format!("{i:05}.png")));
        assert_eq!(img, (32, 32));
    }
    let index = std::fs::read_to_string(out.join("prompts.jsonl")).unwrap();
    assert_eq!(index.lines().count(), 4);
}

/// `sample --sigmas` samples on a given grid (a DMD2 student's): the manifest's list with its final
/// 0 and the list without it give the same pictures, other sigmas other ones, and a grid that
/// does not decrease within (0, 1] is refused by name.
#[test]
fn sample_takes_a_student_grid() {
    let root = scratch("cli-sample-sigmas");
    let model = root.join("tiny");
    let made = flowtune(&["make-tiny", "sd3", &model.display().to_string(), "--seed", "5"]);
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let run = |sigmas: &str, out: &str| {
        let out = root.join(out);
        let args = [
            "sample",
            "--model",
            &model.display().to_string(),
            "--prompts",
            &repo("examples/prompts/tiny.txt"),
            "--sigmas",
            sigmas,
            "--guidance",
            "1",
            "--resolution",
            "32",
            "--out",
            &out.display().to_string(),
        ];
        let done = flowtune(&args);
        (done, out)
    };
    let png = |dir: &std::path::Path| std::fs::read(dir.join("00001.png")).unwrap();
    let (done, with_zero) = run("1,0.9,0.75,0.5,0", "with-zero");
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let (done, without) = run("1,0.9,0.75,0.5", "without");
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    assert_eq!(png(&with_zero), png(&without), "the final 0 is implied");
    let (done, other) = run("1,0.6,0.3", "other");
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    assert_ne!(png(&with_zero), png(&other), "the grid is used");
    let (refused, _) = run("0.5,0.9", "refused");
    assert_bad_input(&refused, &["--sigmas", "decreasing"]);
}

/// Width and height from a PNG header.
fn image_size(path: &std::path::Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[1..4], b"PNG", "{} is a PNG", path.display());
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&bytes[16..20]), be(&bytes[20..24]))
}

/// SIGKILL at any moment (possibly mid-checkpoint) leaves only complete checkpoints behind, and a
/// rerun with `resume: auto` continues from the newest one to the end.
#[test]
fn a_killed_run_resumes_from_its_last_complete_checkpoint() {
    let root = scratch("cli-kill");
    let (model, out) = (root.join("tiny"), root.join("run"));
    assert!(flowtune(&["make-tiny", "sd3", &model.display().to_string()]).status.success());
    let args = |steps: &str| {
        vec![
            "train".to_string(),
            repo("examples/flow_grpo_tiny.yaml"),
            format!("model.path={}", model.display()),
            format!("data.train_files=[{}]", repo("examples/prompts/tiny.txt")),
            format!("trainer.output_dir={}", out.display()),
            format!("trainer.total_steps={steps}"),
            "trainer.save_freq=1".into(),
        ]
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_flowtune"))
        .args(args("400"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait for a few checkpoints, then kill without warning.
    let ckpts = out.join("checkpoints");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::fs::read_dir(&ckpts).map(|d| d.count()).unwrap_or(0) < 2
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let complete: Vec<String> = std::fs::read_dir(&ckpts)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step_"))
        .collect();
    assert!(!complete.is_empty(), "at least one checkpoint was complete before the kill");
    for name in &complete {
        assert!(ckpts.join(name).join("state.json").exists(), "{name} is complete");
    }
    let newest: u64 = complete.iter().map(|n| n["step_".len()..].parse().unwrap()).max().unwrap();
    let target = (newest + 2).to_string();
    let resumed =
        Command::new(env!("CARGO_BIN_EXE_flowtune")).args(args(&target)).output().unwrap();
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("(step {newest})")),
        "resumed from the newest complete checkpoint: {stderr}"
    );
    assert!(stdout_of(&resumed).contains("trained 2 steps"));
    // Steps logged after the last checkpoint by the killed run are replaced, not repeated.
    let steps: Vec<u64> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, (1..=newest + 2).collect::<Vec<_>>());
}

fn stdout_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Ctrl-C (SIGINT) says what it will do, finishes the step, saves a checkpoint for it and exits
/// non-zero saying so.
#[test]
fn ctrl_c_saves_a_checkpoint_and_exits_saying_so() {
    let root = scratch("cli-int");
    let (model, out) = (root.join("tiny"), root.join("run"));
    assert!(flowtune(&["make-tiny", "sd3", &model.display().to_string()]).status.success());
    let child = Command::new(env!("CARGO_BIN_EXE_flowtune"))
        .args([
            "train".to_string(),
            repo("examples/flow_grpo_tiny.yaml"),
            format!("model.path={}", model.display()),
            format!("data.train_files=[{}]", repo("examples/prompts/tiny.txt")),
            format!("trainer.output_dir={}", out.display()),
            "trainer.total_steps=400".into(),
            "trainer.save_freq=0".into(),
        ])
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let metrics = out.join("metrics.jsonl");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::fs::read_to_string(&metrics).map(|s| s.lines().count()).unwrap_or(0) < 2
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let done = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(1), "{stderr}");
    let steps = std::fs::read_to_string(&metrics).unwrap().lines().count();
    let said =
        "Ctrl-C (SIGINT): finishing this step, then saving a checkpoint and stopping (Ctrl-C \
                again aborts at once)";
    assert!(stderr.contains(said), "{stderr}");
    let stopped =
        format!("error: stopped by Ctrl-C (SIGINT) after step {steps}, with a checkpoint");
    assert!(stderr.contains(&stopped), "{stderr}");
    assert!(out.join(format!("checkpoints/step_{steps:06}/state.json")).exists());
}

/// 4 steps in one run equal 2 steps + resume + 2 steps: the same LoRA bits and the same metrics
/// at every step. Each run is its own process, as a real resume is; both are the same computation
/// on this machine, bit for bit, so this test keeps the JPEG reward (the tests of runs that are not
/// bit-identical by construction score with `brightness`).
#[test]
fn resuming_gives_the_same_weights_and_metrics() {
    let root = scratch("cli-resume");
    let model = root.join("tiny");
    assert!(flowtune(&["make-tiny", "sd3", &model.display().to_string(), "--seed", "3"])
        .status
        .success());
    let run = |out: &str, steps: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_flowtune"))
            .args([
                "train".to_string(),
                repo("examples/flow_grpo_tiny.yaml"),
                format!("model.path={}", model.display()),
                format!("data.train_files=[{}]", repo("examples/prompts/tiny.txt")),
                format!("trainer.output_dir={}", root.join(out).display()),
                format!("trainer.total_steps={steps}"),
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    run("straight", "4");
    run("resumed", "2");
    run("resumed", "4");
    let lora = |out: &str| -> std::collections::BTreeMap<String, tch::Tensor> {
        tch::Tensor::read_safetensors(root.join(out).join("lora/pytorch_lora_weights.safetensors"))
            .unwrap()
            .into_iter()
            .collect()
    };
    let (a, b) = (lora("straight"), lora("resumed"));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (name, t) in &a {
        assert!(t.equal(&b[name]), "{name} differs after resuming");
    }
    let lines = |out: &str| -> Vec<serde_json::Value> {
        std::fs::read_to_string(root.join(out).join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let (ma, mb) = (lines("straight"), lines("resumed"));
    assert_eq!((ma.len(), mb.len()), (4, 4));
    for step in 0..4 {
        for (key, value) in ma[step].as_object().unwrap() {
            if !key.starts_with("timing_s/") && !key.starts_with("perf/") {
                assert_eq!(value, &mb[step][key], "step {} {key}", step + 1);
            }
        }
    }
}

/// `flowtune list` shows the registered model families with their components; an unknown
/// pipeline class is bad input (exit 2) naming the known classes; a reward server that is down
/// is a runtime failure (exit 1), never a score of 0.
#[test]
fn families_are_listed_and_failures_split_into_bad_input_and_runtime() {
    let out = flowtune(&["list"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for needle in [
        "sd3",
        "StableDiffusion3Pipeline",
        "SD3Transformer2DModel",
        "text_encoder_3",
        "WanPipeline",
    ] {
        assert!(stdout.contains(needle), "`{needle}` missing from: {stdout}");
    }
    let root = scratch("cli-families");
    let (model, wan) = (root.join("tiny"), root.join("wan"));
    assert!(flowtune(&["make-tiny", "sd3", &model.display().to_string()]).status.success());
    std::fs::create_dir_all(&wan).unwrap();
    std::fs::write(wan.join("model_index.json"), r#"{"_class_name": "WanImageToVideoPipeline"}"#)
        .unwrap();
    let train = |model: &std::path::Path, extra: &[&str]| {
        let mut args = vec![
            "train".to_string(),
            repo("examples/flow_grpo_tiny.yaml"),
            format!("model.path={}", model.display()),
            format!("data.train_files=[{}]", repo("examples/prompts/tiny.txt")),
            format!("trainer.output_dir={}", root.join("run").display()),
            "trainer.total_steps=1".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        Command::new(env!("CARGO_BIN_EXE_flowtune")).args(&args).output().expect("run flowtune")
    };
    assert_bad_input(
        &train(&wan, &[]),
        &[
            "model_index.json",
            "`WanImageToVideoPipeline` is not supported; supported: StableDiffusion3Pipeline",
        ],
    );
    let down = train(
        &model,
        &[
            r#"reward.functions=[{name: http, url: "http://127.0.0.1:9/score", http: {max_retries: 0, timeout_s: 5}}]"#,
        ],
    );
    let stderr = String::from_utf8_lossy(&down.stderr);
    assert_eq!(down.status.code(), Some(1), "stderr: {stderr}");
    assert!(stderr.contains("error: ") && stderr.contains("http"), "{stderr}");
}

/// `flowtune score` prints one JSON line per image with the reward's score, equal to the reward
/// computed in-process; a failing scorer gives every line an `error` and exit 1; a count mismatch
/// is bad input. `flowtune bench reward` times a reward.
#[test]
fn score_prints_one_line_per_image() {
    use flowtune_rewards::{JpegSize, Reward, RgbImage, Sample};
    let dir = scratch("cli-score");
    let images = dir.join("images");
    std::fs::create_dir_all(&images).unwrap();
    let pictures: Vec<RgbImage> = (0..3u32)
        .map(|k| {
            RgbImage::from_fn(24, 16, |x, y| image::Rgb([(x * 9 * k) as u8, (y * 13) as u8, 77]))
        })
        .collect();
    for (i, p) in pictures.iter().enumerate() {
        p.save(images.join(format!("{i:03}.png"))).unwrap();
    }
    let prompts = text_file("score-prompts.txt", "a\nb\nc\n");
    let images_arg = images.display().to_string();
    let score_jpeg = |prompts: &str| {
        flowtune(&[
            "score",
            "--reward",
            "jpeg_compressibility",
            "--images",
            &images_arg,
            "--prompts",
            prompts,
        ])
    };
    let out = score_jpeg(&prompts);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    let null = serde_json::Value::Null;
    let samples: Vec<Sample<'_>> = pictures
        .iter()
        .zip(["a", "b", "c"])
        .map(|(image, prompt)| Sample {
            image,
            frames: 1,
            audio: None,
            prompt,
            ground_truth: None,
            data_source: "x",
            extra_info: &null,
        })
        .collect();
    let want = JpegSize { compressible: true }.score(&samples).unwrap();
    for ((line, want), file) in lines.iter().zip(&want).zip(["000.png", "001.png", "002.png"]) {
        assert_eq!(line["file"], file);
        assert!((line["score"].as_f64().unwrap() - want.value).abs() < 1e-12, "{line}");
        assert!(line["error"].is_null());
    }
    // A VLM judge that is not there: every image carries the error, exit 1.
    let config = text_file(
        "judge.yaml",
        "functions:\n  - name: vlm_judge\n    url: http://127.0.0.1:9/v1/chat/completions\n    vlm: {model: m}\n    http: {max_retries: 0, timeout_s: 5}\n",
    );
    let out = flowtune(&[
        "score",
        "--reward-config",
        &config,
        "--images",
        &images_arg,
        "--prompts",
        &prompts,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 3);
    assert!(
        stdout.lines().all(|l| l.contains("\"score\":null") && l.contains("vlm_judge")),
        "{stdout}"
    );
    let bench = flowtune(&[
        "bench",
        "reward",
        "--name",
        "jpeg_compressibility",
        "--count",
        "2",
        "--resolution",
        "32",
        "--iters",
        "1",
    ]);
    let stdout = String::from_utf8_lossy(&bench.stdout);
    assert!(
        bench.status.success()
            && stdout.contains("reward jpeg_compressibility: 2 images of 32²")
            && stdout.contains("images/s"),
        "{stdout}"
    );
    let two = text_file("score-two.txt", "a\nb\n");
    assert_bad_input(&score_jpeg(&two), &["holds 3 images", "holds 2 prompts"]);
}

#[test]
fn debug_rollout_reproduces_the_qwen_image_reference_loop() {
    // The fixture of scripts/reference_qwen_rollout.py: its prompts, noise and settings.
    let io = tensors(in_fixtures("qwen_image_rollout_io.safetensors"));
    let dir = scratch("debug-rollout");
    let prompts = dir.join("prompts.txt");
    std::fs::write(
        &prompts,
        "a red circle next to a blue square\n一只猫坐在垫子上, \"OPEN\" 24/7\n",
    )
    .unwrap();
    let noise = dir.join("noise.safetensors");
    tch::Tensor::write_safetensors(
        &[
            ("initial_latents", &io["input.initial_latents"]),
            ("step_noise", &io["input.step_noise"]),
        ],
        &noise,
    )
    .unwrap();
    let out = dir.join("trajectory.safetensors");
    let (model, p, n, o) = (
        in_fixtures("qwen_image_pipeline"),
        prompts.display().to_string(),
        noise.display().to_string(),
        out.display().to_string(),
    );
    let run = |steps: &str| {
        flowtune(&[
            "debug",
            "rollout",
            "--model",
            &model,
            "--prompts",
            &p,
            "--noise",
            &n,
            "--out",
            &o,
            "--steps",
            steps,
            "--guidance",
            "4",
            "--noise-level",
            "0.7",
            "--window-start",
            "1",
            "--window-size",
            "3",
        ])
    };
    let done = run("6");
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let got = tensors(&out);
    for key in ["all_latents", "all_log_probs", "all_timesteps", "final_latents"] {
        let (g, w) = (&got[key], &io[&format!("output.{key}")]);
        let rel = (g - w).norm().double_value(&[]) / w.norm().double_value(&[]);
        assert!(rel < 1e-3, "{key}: relative error {rel}");
    }
    let want = ((io["output.image"].clamp(-1.0, 1.0) + 1.0) * 127.5)
        .round()
        .permute([0, 2, 3, 1])
        .to_kind(tch::Kind::Int);
    let off = (got["images"].to_kind(tch::Kind::Int) - want).abs().max().int64_value(&[]);
    assert!(off <= 1, "pictures differ by {off} levels");
    assert_eq!(image_size(&dir.join("trajectory_1.png")), (80, 48));
    // Noise for another step count is named, not silently cut.
    assert_bad_input(&run("5"), &["noise.safetensors", "step_noise", "--steps 5"]);
}

/// `flowtune debug rollout` on the tiny Wan pipeline equals `scripts/reference_wan_rollout.py`'s
/// 5-frame 32×64 case: trajectory, log-probs, integer timesteps, and the 5 decoded frames side by
/// side.
#[test]
fn debug_rollout_reproduces_the_wan_reference_loop() {
    debug_wan_rollout("wan_rollout_f5_io.safetensors");
}

/// The same for image-to-video (`--images`: the fixture's first-frame picture).
#[test]
fn debug_rollout_reproduces_the_wan_image_to_video_loop() {
    debug_wan_rollout("wan_i2v_rollout_f5_io.safetensors");
}

/// `flowtune debug rollout` on the tiny Wan pipeline with the prompts, noise and settings of the
/// `fixture` of scripts/reference_wan_rollout.py (5 frames at 32 × 64), and its picture if any.
fn debug_wan_rollout(fixture: &str) {
    let io = tensors(in_fixtures(fixture));
    let stem = fixture.trim_end_matches(".safetensors");
    let dir = scratch(&format!("debug-{stem}"));
    let prompts = dir.join("prompts.txt");
    std::fs::write(
        &prompts,
        "a red fox runs  through fresh snow\na time-lapse of clouds over a mountain lake at dawn, \
         with birds crossing the frame from left to right\n",
    )
    .unwrap();
    let noise = dir.join("noise.safetensors");
    let pairs = [
        ("initial_latents", &io["input.initial_latents"]),
        ("step_noise", &io["input.step_noise"]),
    ];
    tch::Tensor::write_safetensors(&pairs, &noise).unwrap();
    let out = dir.join("trajectory.safetensors");
    let mut pictures = vec![];
    if let Some(picture) = io.get("input.picture") {
        let (h, w, _) = picture.size3().unwrap();
        let bytes = Vec::<u8>::try_from(picture.flatten(0, -1)).unwrap();
        let path = dir.join("first.png");
        image::RgbImage::from_raw(w as u32, h as u32, bytes).unwrap().save(&path).unwrap();
        pictures = vec!["--images".to_string(), path.display().to_string()];
    }
    let (model, p, n, o) = (
        in_fixtures("wan_pipeline"),
        prompts.display().to_string(),
        noise.display().to_string(),
        out.display().to_string(),
    );
    let mut args = vec![
        "debug",
        "rollout",
        "--model",
        &model,
        "--prompts",
        &p,
        "--noise",
        &n,
        "--out",
        &o,
        "--steps",
        "6",
        "--guidance",
        "4",
        "--window-start",
        "1",
        "--window-size",
        "3",
        "--num-frames",
        "5",
        "--max-sequence-length",
        "512",
    ];
    args.extend(pictures.iter().map(String::as_str));
    let done = flowtune(&args);
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let got = tensors(&out);
    for key in ["all_latents", "all_log_probs", "all_timesteps", "final_latents"] {
        let (g, w) = (&got[key], &io[&format!("output.{key}")]);
        let rel = (g - w).norm().double_value(&[]) / w.norm().double_value(&[]);
        assert!(rel < 1e-3, "{key}: relative error {rel}");
    }
    let video = &io["output.video"];
    let (b, c, t, h, w) = video.size5().unwrap();
    let want = ((video.clamp(-1.0, 1.0) + 1.0) * 127.5).round().permute([0, 3, 2, 4, 1]);
    let want = want.reshape([b, h, t * w, c]).to_kind(tch::Kind::Int);
    let off = (got["images"].to_kind(tch::Kind::Int) - want).abs().max().int64_value(&[]);
    assert!(off <= 1, "frames differ by {off} levels");
    assert_eq!(image_size(&dir.join("trajectory_1.png")), (5 * 64, 32));
}

/// `model.path` as a Hub id: a pipeline in a cache laid out as `huggingface_hub` writes it
/// (`refs/main` → `snapshots/<commit>`) trains with no network; a missing id is bad input that
/// says how to download it.
#[test]
fn a_hub_id_trains_from_the_local_cache() {
    let root = scratch("hub");
    let repo_dir = root.join("hub/models--tiny-org--tiny-sd3");
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let snapshot = repo_dir.join("snapshots").join(commit);
    assert!(flowtune(&["make-tiny", "sd3", &snapshot.display().to_string()]).status.success());
    std::fs::create_dir_all(repo_dir.join("refs")).unwrap();
    std::fs::write(repo_dir.join("refs/main"), commit).unwrap();
    let train = |id: &str| {
        Command::new(env!("CARGO_BIN_EXE_flowtune"))
            .args(["train", &repo("examples/flow_grpo_tiny.yaml")])
            .arg(format!("model.path={id}"))
            .arg(format!("data.train_files=[{}]", repo("examples/prompts/tiny.txt")))
            .arg(format!("trainer.output_dir={}", root.join("run").display()))
            .arg("trainer.total_steps=1")
            .env("HF_HUB_CACHE", root.join("hub"))
            .output()
            .unwrap()
    };
    let out = train("tiny-org/tiny-sd3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(root.join("run/lora/pytorch_lora_weights.safetensors").exists());
    assert_bad_input(
        &train("tiny-org/missing"),
        &["tiny-org/missing", "hf download tiny-org/missing"],
    );
}

/// The device a run names reaches it: `launch --device` goes to every rank, `trainer.device`
/// is read, and each is refused by its own name where torch has no such device; a launcher and
/// a command that name different devices are refused.
#[test]
fn named_devices_reach_the_ranks_or_are_refused_by_name() {
    if tch::Cuda::device_count() > 0 {
        return; // the refusals below need a machine without CUDA
    }
    let recipe = repo("examples/flow_grpo_tiny.yaml");
    let out = flowtune(&["launch", "--device", "cuda", "--nproc", "1", "--", "train", &recipe]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("rank 0: error: --device cuda:0: torch sees 0 CUDA device(s); use cpu"),
        "{stderr}"
    );
    let out = flowtune(&["train", &recipe, "trainer.device=cuda:1"]);
    assert_bad_input(&out, &["trainer.device cuda:1: torch sees 0 CUDA device(s)"]);
    let out = flowtune(&["train", &recipe, "trainer.device=gpu"]);
    assert_bad_input(&out, &["trainer.device: `gpu`: expected cpu, cuda or cuda:N"]);
    let args = ["launch", "--device", "cuda", "--nproc", "1", "--", "--device", "cpu", "train"];
    let out = flowtune(&args);
    assert_bad_input(&out, &["launch --device cuda:0 and the command's --device cpu differ"]);
}

/// Mistakes a new user makes fail before any step, each in one line naming the key, and leave no
/// run folder: a missing prompt file or pipeline, a LoRA target that adapts nothing, a group of
/// one where advantages are relative to the group, a resolution the model cannot take, a missing
/// or sampling in-process judge.
#[test]
fn mistakes_fail_before_training_by_name() {
    let dir = scratch("cli-mistakes");
    let model = dir.join("tiny");
    assert!(flowtune(&["make-tiny", "sd3", &model.display().to_string()]).status.success());
    let out = dir.join("run");
    let train = |extra: &[&str]| {
        let mut args = vec![
            "train".to_string(),
            repo("examples/flow_grpo_tiny.yaml"),
            format!("model.path={}", model.display()),
            format!("data.train_files=[{}]", repo("examples/prompts/tiny.txt")),
            format!("trainer.output_dir={}", out.display()),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        flowtune(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let cases: [(&[&str], &[&str]); 11] = [
        (&["data.train_files=[no-such-prompts.txt]"], &["data.train_files[0]: no-such-prompts.txt does not exist (from the working directory"]),
        (&["rollout.nosie_level=0.5"], &["override `rollout.nosie_level=0.5`: rollout.nosie_level: unknown field `nosie_level`; did you mean `noise_level`?"]),
        (&["reward.functions=[{name: brightnes}]"], &["override `reward.functions=[{name: brightnes}]`: reward: reward config: unknown reward `brightnes`"]),
        (&["rollout.sde_type=dance"], &["override `rollout.sde_type=dance`", "did you mean `dance_sde`?"]),
        (&["model.path=no-such-model"], &["model.path: cannot read no-such-model/model_index.json"]),
        (&["model.lora.target_modules=[to_q, to_qq]"], &["model.lora.target_modules entry `to_qq` names none of the model's", "nearest: `to_q`"]),
        (&["rollout.n=1"], &["rollout.n: 1: flow_grpo's advantages are rewards minus their prompt group's mean"]),
        (&["model.resolution=512"], &["model.resolution 512×512 pixels", "position table covers sides up to"]),
        (&["reward.functions=[{name: vlm_judge, vlm: {backend: native, model: no-such-judge, temperature: 0}}]"], &["reward.functions[0].vlm.model: no-such-judge has no config.json"]),
        (&["reward.functions=[{name: vlm_judge, vlm: {backend: native, model: no-such-judge}}]"], &["backend native answers greedily; set vlm.temperature: 0 (got 0.7)"]),
        (&["trainer.rollout_ranks=1"], &["trainer.rollout_ranks 1 leaves no training rank in a job of 1 rank(s); launch more"]),
    ];
    for (extra, needles) in cases {
        assert_bad_input(&train(extra), needles);
        assert!(!out.exists(), "{extra:?} left a run folder");
    }
}

/// A recipe's relative input paths are taken from its folder, wherever it runs from; an
/// override's from the working directory.
#[test]
fn recipe_paths_follow_the_recipe_file() {
    let dir = scratch("cli-recipe-paths");
    let model = dir.join("models/tiny");
    assert!(flowtune(&["make-tiny", "sd3", &model.display().to_string()]).status.success());
    std::fs::create_dir_all(dir.join("recipes/prompts")).unwrap();
    std::fs::copy(repo("examples/prompts/tiny.txt"), dir.join("recipes/prompts/p.txt")).unwrap();
    let text = std::fs::read_to_string(repo("examples/flow_grpo_tiny.yaml")).unwrap();
    let (model_line, prompts) = ("path: /tmp/flowtune-tiny-sd3", "[prompts/tiny.txt]");
    assert!(text.contains(model_line) && text.contains(prompts), "{text}");
    let text = text.replace(model_line, "path: ../models/tiny").replace(prompts, "[prompts/p.txt]");
    let recipe = dir.join("recipes/r.yaml");
    std::fs::write(&recipe, text).unwrap();
    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let run = |args: &[String]| {
        Command::new(env!("CARGO_BIN_EXE_flowtune"))
            .args(args)
            .current_dir(&elsewhere)
            .output()
            .expect("run flowtune")
    };
    let recipe = recipe.display().to_string();
    let out = run(&["config".into(), "show".into(), recipe.clone()]);
    let shown = String::from_utf8_lossy(&out.stdout);
    let in_recipes = |p: &str| dir.join("recipes").join(p).display().to_string();
    assert!(shown.contains(&format!("path: {}", in_recipes("../models/tiny"))), "{shown}");
    assert!(shown.contains(&in_recipes("prompts/p.txt")), "{shown}");
    let output = dir.join("run").display().to_string();
    let train = [
        "train".into(),
        recipe.clone(),
        "trainer.total_steps=1".into(),
        format!("trainer.output_dir={output}"),
    ];
    let out = run(&train);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The same relative path as an override is the working directory's, and named as such.
    let out = run(&[train.as_slice(), &["data.train_files=[prompts/p.txt]".into()]].concat());
    assert_bad_input(
        &out,
        &["data.train_files[0]: prompts/p.txt does not exist (from the working directory"],
    );
}

/// `bench reward --transformers`: the native judge and transformers' `generate` on the same tiny
/// judge, pictures and batches in one run; both answer with the same token counts, and the
/// figures (seconds of each, their ratio) go to the JSON.
#[test]
fn bench_reward_times_a_native_judge_against_transformers() {
    let dir = scratch("bench-judge");
    let config = dir.join("judge.yaml");
    std::fs::write(
        &config,
        format!(
            "functions:\n  - name: vlm_judge\n    vlm: {{backend: native, model: {}, temperature: 0, \
             max_tokens: 16, batch_size: 3, device: cpu}}\n",
            in_fixtures("vlm_qwen25_tiny")
        ),
    )
    .unwrap();
    let home = PathBuf::from(std::env::var("HOME").unwrap_or_default());
    let var = |k: &str| std::env::var_os(k).map(PathBuf::from);
    let cache = var("FLOWTUNE_CACHE").unwrap_or_else(|| home.join(".cache/flowtune"));
    let python = var("FLOWTUNE_VENV").unwrap_or_else(|| cache.join("venv")).join("bin/python");
    let json = dir.join("bench.json");
    let out = Command::new(env!("CARGO_BIN_EXE_flowtune"))
        .args(["bench", "reward", "--reward-config", &config.display().to_string()])
        .args(["--count", "5", "--resolution", "64", "--iters", "1", "--transformers"])
        .args(["--anchor", &repo("scripts/bench_vlm_judge_transformers.py")])
        .args(["--json", &json.display().to_string()])
        .env("PYTHON", &python)
        .env("PYTHONPATH", cache.join("anchors"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        said.contains("flowtune / transformers:") && said.contains("the same in both"),
        "{said}"
    );
    let figures: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for key in ["seconds", "transformers_seconds", "speedup"] {
        assert!(figures[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {figures}");
    }
    let ratio =
        figures["transformers_seconds"].as_f64().unwrap() / figures["seconds"].as_f64().unwrap();
    assert!((figures["speedup"].as_f64().unwrap() - ratio).abs() < 1e-9, "{figures}");
    assert!(figures["answer_tokens"].as_i64().unwrap() >= 5, "{figures}");
}

/// `bench step --overlap-ab`: the step with `reward.overlap` on and off, alternating, against a
/// reward server that answers each request after a fixed delay. The serial runs' rollout phase
/// holds the scoring; both score every sample alike. (How much the overlap hides is a timing,
/// which the report gives and `docs/perf/` records, not something a test asserts.)
#[test]
fn bench_step_sets_overlapped_scoring_against_serial_scoring() {
    let root = scratch("bench-overlap");
    let model = root.join("tiny");
    assert!(flowtune(&["make-tiny", "sd3", &model.display().to_string()]).status.success());
    let script = repo("examples/reward_server.py");
    let mut server = Command::new("python3")
        .args([script.as_str(), "--port", "0", "--delay", "0.05"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    let stdout = server.stdout.take().unwrap();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
    let port = line.trim().strip_prefix("listening on ").expect("a port line").to_string();
    let reward = format!(
        "reward.functions=[{{name: http, url: \"http://127.0.0.1:{port}/score\", http: {{batch_size: 2, max_concurrency: 1}}}}]"
    );
    let json = root.join("step.json");
    let out = flowtune(&[
        "bench",
        "step",
        &repo("examples/flow_grpo_tiny.yaml"),
        &format!("model.path={}", model.display()),
        "rollout.batch_size=2",
        &reward,
        "--overlap-ab",
        "1",
        "--json",
        json.to_str().unwrap(),
    ]);
    let _ = server.kill();
    let _ = server.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("reward overlap: rollout phase "), "{stdout}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let ab = &r["reward_overlap"];
    assert_eq!(ab["rewards_identical"], true, "{ab}");
    assert_eq!(ab["rounds"], 1);
    let f = |k: &str| ab[k].as_f64().unwrap_or_else(|| panic!("{k}: {ab}"));
    // 4 samples in 2 requests of 0.05 s each: the scorers were busy at least that long.
    assert!(f("scoring_s") >= 0.1 && f("sampling_s") > 0.0, "{ab}");
    assert!((f("sum_s") - f("sampling_s") - f("scoring_s")).abs() < 1e-9, "{ab}");
    let serial = ab["serial"]["rollout_s"].as_f64().unwrap();
    assert!(serial >= f("scoring_s"), "a serial rollout phase holds its scoring: {ab}");
}

/// A printing command whose reader goes away (`flowtune config keys | head`) ends quietly on
/// SIGPIPE, as Unix tools do, instead of panicking on the broken pipe.
#[test]
fn a_printing_command_ends_quietly_when_its_reader_goes_away() {
    use std::os::unix::process::ExitStatusExt;
    let mut child = Command::new(env!("CARGO_BIN_EXE_flowtune"))
        .args(["config", "keys"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{:?}: {stderr}", out.status);
}
