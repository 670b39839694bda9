//! Data-parallel training over Gloo on this machine, through the `flowtune` binary: two ranks with
//! half a step each train exactly as one process with the whole step (Flow-GRPO, online DPO,
//! DiffusionNFT); a two-rank job resumes a one-rank run; a rank that dies stops the job and leaves
//! a loadable checkpoint; torchrun launches it as well as `flowtune launch` does.
//!
//! Runs that must be the same computation score with `brightness`, a reward smooth in the pixels,
//! sum gradients exactly (`trainer.exact_gradient_sum`, so the layouts' weights agree bit for
//! bit) and are compared at every step. A reward that jumps with one level of one pixel (JPEG
//! bytes) would turn any last-bit difference into different rewards on some CPUs; the JPEG reward
//! path keeps one test (torchrun), compared at its first step only, before any update.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use flowtune_fixtures::scratch;
use tch::Tensor;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn flowtune() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_flowtune"));
    c.env("GLOO_SOCKET_IFNAME", "lo").env("OMP_NUM_THREADS", "1");
    c
}

/// One tiny SD3 pipeline for the whole binary.
fn pipeline() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = flowtune_fixtures::shared!("pipeline");
        let out = flowtune().args(["make-tiny", "sd3"]).arg(&d).output().expect("make-tiny");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        d
    })
}

/// `train examples/<recipe>` on the tiny pipeline into `out`, with `extra` overrides.
fn train_args(recipe: &str, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "train".to_string(),
        root().join("examples").join(recipe).display().to_string(),
        format!("model.path={}", pipeline().display()),
        format!("data.train_files=[{}]", root().join("examples/prompts/tiny.txt").display()),
        format!("trainer.output_dir={}", out.display()),
        // Rows go through the model two at a time in both layouts, so samples are bit-identical.
        "rollout.batch_size=2".into(),
        "trainer.micro_batch_size=1".into(),
        "trainer.image_freq=1".into(),
        "trainer.save_freq=1".into(),
        "trainer.keep_last=10".into(),
        "trainer.dist_timeout_s=60".into(),
        // Gradients summed exactly: the layouts then train bit for bit alike.
        "trainer.exact_gradient_sum=true".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// The reward of every equivalence test: smooth in the pixels.
const SMOOTH: &str = "reward.functions=[{name: brightness}]";

fn check(out: Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One process.
fn single(recipe: &str, out: &Path, extra: &[&str]) {
    check(flowtune().args(train_args(recipe, out, extra)).output().unwrap(), "1-rank run");
}

/// Two ranks through `flowtune launch`.
fn two_ranks(recipe: &str, out: &Path, extra: &[&str]) {
    ranks(2, recipe, out, extra);
}

/// `n` ranks through `flowtune launch`.
fn ranks(n: usize, recipe: &str, out: &Path, extra: &[&str]) {
    let mut c = flowtune();
    c.args(["launch", "--nproc", &n.to_string(), "--"]).args(train_args(recipe, out, extra));
    check(c.output().unwrap(), &format!("{n}-rank run"));
}

fn metrics(out: &Path) -> Vec<BTreeMap<String, serde_json::Value>> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn close(a: f64, b: f64, rtol: f64) -> bool {
    (a - b).abs() <= rtol * a.abs().max(b.abs()) + 1e-6
}

/// Every metric but timings, throughput and the world size agrees step by step (1e-5 relative);
/// so do the exported weights (relative L2: 1e-5 over all of them, 1e-3 per tensor, since a
/// gradient summed in another order can cancel more in one small tensor) and the grid of the
/// first step's samples (within one level of 255 in under 0.1% of the values).
fn assert_same_run(a: &Path, b: &Path, steps: std::ops::RangeInclusive<u64>) {
    assert_same_run_but(a, b, steps, &[]);
}

/// [`assert_same_run`], with the metrics that start with one of `ill_conditioned` within 1e-3.
fn assert_same_run_but(
    a: &Path,
    b: &Path,
    steps: std::ops::RangeInclusive<u64>,
    ill_conditioned: &[&str],
) {
    let (ma, mb) = (metrics(a), metrics(b));
    let mut compared = 0;
    for k in steps {
        let line = |m: &[BTreeMap<String, serde_json::Value>]| {
            m.iter().find(|l| l["step"] == k).cloned().unwrap_or_else(|| panic!("no step {k}"))
        };
        let (la, lb) = (line(&ma), line(&mb));
        for (key, va) in &la {
            if ["timing_s/", "perf/", "dist/"].iter().any(|p| key.starts_with(p)) {
                continue;
            }
            let vb = lb.get(key).unwrap_or_else(|| panic!("step {k}: {key} missing from {b:?}"));
            let (x, y) = (va.as_f64().unwrap_or(f64::NAN), vb.as_f64().unwrap_or(f64::NAN));
            let rtol = if ill_conditioned.iter().any(|p| key.starts_with(p)) { 1e-3 } else { 1e-5 };
            assert!(close(x, y, rtol) || (x.is_nan() && y.is_nan()), "step {k} {key}: {x} vs {y}");
            compared += 1;
        }
    }
    assert!(compared > 10, "only {compared} metrics compared");
    let (wa, wb) = (exported(a), exported(b));
    assert_eq!(wa.len(), wb.len());
    let (mut moved, mut diff_sq, mut norm_sq) = (false, 0.0, 0.0);
    for (name, ta) in &wa {
        let diff = (ta - &wb[name]).norm().double_value(&[]);
        let norm = ta.norm().double_value(&[]);
        assert!(diff <= 1e-3 * norm + 1e-9, "{name}: |Δ| {diff:e} for |w| {norm:e}");
        (diff_sq, norm_sq) = (diff_sq + diff * diff, norm_sq + norm * norm);
        moved |= !name.contains("lora_") || (name.contains("lora_B") && norm > 0.0);
    }
    let relative = (diff_sq / norm_sq).sqrt();
    assert!(relative <= 1e-5, "the weights differ by {relative:e} (relative L2)");
    eprintln!("weights: relative L2 difference {relative:.2e}");
    assert!(moved, "the LoRA never moved, so the comparison says nothing");
    // Text is encoded for a rank's rows only, and a matmul over fewer rows may round differently.
    let grid = |d: &Path| image::open(d.join("images/train_step_000001.png")).unwrap().to_rgb8();
    let (ga, gb) = (grid(a), grid(b));
    let off: Vec<i32> = ga
        .iter()
        .zip(gb.iter())
        .map(|(x, y)| (*x as i32 - *y as i32).abs())
        .filter(|d| *d > 0)
        .collect();
    assert!(
        off.iter().all(|d| *d <= 1),
        "the first step's samples differ by up to {:?}",
        off.iter().max()
    );
    assert!(off.len() * 1000 < ga.len(), "{} of {} sample values differ", off.len(), ga.len());
}

/// The exported weights: the LoRA, or after full fine-tuning the transformer.
fn exported(out: &Path) -> BTreeMap<String, Tensor> {
    let lora = out.join("lora/pytorch_lora_weights.safetensors");
    let file = if lora.exists() {
        lora
    } else {
        out.join("transformer/diffusion_pytorch_model.safetensors")
    };
    Tensor::read_safetensors(file).unwrap().into_iter().collect()
}

#[test]
fn two_ranks_train_as_one_process_with_the_whole_batch() {
    // Two steps each, both compared: samples, rewards, advantages (pairs, timesteps), loss, the
    // summed gradient, the update and validation, then the same from the updated weights.
    for recipe in ["flow_grpo_tiny.yaml", "dpo_tiny.yaml", "diffusion_nft_tiny.yaml"] {
        // Validation (shared out between the ranks) after every step, on the 4 tiny prompts.
        let val =
            format!("data.val_files=[{}]", root().join("examples/prompts/tiny.txt").display());
        let extra = ["trainer.total_steps=2", "trainer.val_freq=1", &val, SMOOTH];
        let (a, b) = (scratch(&format!("one-{recipe}")), scratch(&format!("two-{recipe}")));
        single(recipe, &a, &extra);
        two_ranks(recipe, &b, &extra);
        assert!(metrics(&b).iter().all(|l| l.keys().any(|k| k.starts_with("val-core/"))));
        assert_same_run(&a, &b, 1..=2);
        assert!(metrics(&b).iter().all(|l| l["dist/world_size"] == 2.0));
        eprintln!("{recipe}: 2 ranks × 1 prompt group = 1 process × 2 groups");
    }
}

/// One tiny pipeline per `make-tiny` arguments (`wan`, `wan --a14b`) for the whole binary.
fn tiny(args: &'static str) -> PathBuf {
    static DIRS: OnceLock<std::sync::Mutex<BTreeMap<&'static str, PathBuf>>> = OnceLock::new();
    let mut dirs = DIRS.get_or_init(Default::default).lock().unwrap();
    dirs.entry(args)
        .or_insert_with(|| {
            let d = flowtune_fixtures::shared!(&args.replace(' ', ""));
            let mut c = flowtune();
            c.arg("make-tiny").args(args.split(' '));
            let out = c.arg(&d).output().expect("make-tiny");
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            d
        })
        .clone()
}

/// Sequence parallelism: a group of 2 ranks, each with half of every sample's tokens, trains as
/// one process (every step compared) on a tiny Wan (text-to-video and image-to-video, and the
/// two-expert A14B layout), a tiny Qwen-Image (joint attention, masked text) and a tiny LTX-2
/// (video and audio tokens both split, 9 audio tokens padded); on Wan so do 2 such groups (4 ranks) with half the
/// step each, and a group whose frozen block weights are sharded over it. (SD3 is compared by the models' sequence_parallel test only: on the tiny SD3 the
/// split matmuls' f32 rounding moves rewards by 6e-6 relative, which the advantages of groups of
/// two magnify to 2.5e-4, past this comparison's 1e-5.)
#[test]
fn sequence_parallel_ranks_train_as_one_process() {
    let files = |f: &str| format!("data.train_files=[{}]", root().join(f).display());
    for (recipe, family, prompts, groups) in [
        ("flow_grpo_wan_tiny.yaml", "wan", "examples/prompts/tiny.txt", 2),
        ("flow_grpo_wan_i2v_tiny.yaml", "wan", "examples/prompts/wan_i2v_tiny.jsonl", 2),
        ("flow_grpo_qwen_image_tiny.yaml", "qwen-image", "examples/prompts/tiny.txt", 1),
        ("flow_grpo_wan_a14b_tiny.yaml", "wan --a14b", "examples/prompts/tiny.txt", 1),
        ("flow_grpo_ltx2_tiny.yaml", "ltx2", "examples/prompts/tiny.txt", 1),
    ] {
        let model = format!("model.path={}", tiny(family).display());
        let extra = ["trainer.total_steps=2", &model, &files(prompts), SMOOTH];
        let sp = [&extra[..], &["trainer.sequence_parallel_size=2"]].concat();
        // A rank's matmuls see half the tokens, so rewards round differently (≈3e-7 relative);
        // the tiny models' two samples of a group differ by ~1e-4 in brightness, and advantages
        // divide by that spread: they, and the gradient norm, agree only to ≈3e-5 (the weights
        // still to 1e-5).
        let same = |a: &Path, b: &Path| {
            assert_same_run_but(a, b, 1..=2, &["critic/advantages/", "actor/grad_norm"])
        };
        let a = scratch(&format!("sp-one-{recipe}"));
        single(recipe, &a, &extra);
        for g in 1..=groups {
            let b = scratch(&format!("sp-{g}x2-{recipe}"));
            ranks(2 * g, recipe, &b, &sp);
            same(&a, &b);
            assert!(metrics(&b).iter().all(|l| l["dist/sequence_parallel_size"] == 2.0
                && l["dist/world_size"] == (2 * g) as f64));
            eprintln!("{recipe}: {g} group(s) of S = 2 = 1 process");
        }
        if family == "wan" {
            // With the frozen block weights sharded over the group too (what 720p needs).
            let b = scratch(&format!("sp-frozen-{recipe}"));
            ranks(2, recipe, &b, &[&sp[..], &["trainer.sharding=frozen"]].concat());
            same(&a, &b);
        }
    }
}

/// Sequence parallelism that cannot work is refused before training, naming the key: a size
/// that does not divide the world, or the model's heads.
#[test]
fn impossible_sequence_parallelism_is_refused_by_name() {
    let model = format!("model.path={}", tiny("wan").display());
    let refused = |n: usize, recipe: &str, extra: &[&str], expected: &str| {
        let out = scratch(&format!("sp-refused-{n}-{recipe}"));
        let mut c = flowtune();
        match n {
            1 => c.args(train_args(recipe, &out, extra)),
            _ => c
                .args(["launch", "--nproc", &n.to_string(), "--"])
                .args(train_args(recipe, &out, extra)),
        };
        let output = c.output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && stderr.contains(expected), "{stderr}");
    };
    let s2 = "trainer.sequence_parallel_size=2";
    refused(
        1,
        "flow_grpo_wan_tiny.yaml",
        &[&model, s2],
        "trainer.sequence_parallel_size 2 does not divide the 1 rank(s)",
    );
    let s4 = "trainer.sequence_parallel_size=4";
    refused(
        4,
        "flow_grpo_wan_tiny.yaml",
        &[&model, s4],
        "trainer.sequence_parallel_size 4 does not divide Wan's 2 attention heads",
    );
}

/// GARDO over two ranks: features, uncertainty ranks and the gate over the whole step, the anchor
/// reset before step 3 (interval 1), every step as one process.
#[test]
fn two_ranks_train_gardo_as_one_process() {
    let clip = root().join("crates/rewards/tests/fixtures/clip");
    let (model, head) = (clip.join("clip_tiny"), clip.join("aesthetic_head.safetensors"));
    let features = format!("actor.gardo_features={}", model.display());
    let rewards = format!(
        "reward.functions=[{{name: brightness}}, {{name: aesthetic, weight: 0, clip: {{model: {}, head: {}, device: cpu}}}}]",
        model.display(),
        head.display()
    );
    let extra = ["trainer.total_steps=3", "actor.gardo_reset_interval=1", &features, &rewards];
    let (a, b) = (scratch("one-gardo"), scratch("two-gardo"));
    single("gardo_tiny.yaml", &a, &extra);
    two_ranks("gardo_tiny.yaml", &b, &extra);
    assert_same_run(&a, &b, 1..=3);
    let gated: f64 = metrics(&a).iter().map(|l| l["actor/gated_fraction"].as_f64().unwrap()).sum();
    assert!(gated > 0.0, "no sample was gated, so the KL path went unchecked");
}

/// DGPO over two ranks, each training its own whole prompt group per pass: shared timesteps,
/// group noise and group weights as one process, every step.
#[test]
fn two_ranks_train_dgpo_as_one_process() {
    // One whole group (rollout.n = 2) per micro-batch in both layouts.
    let extra = ["trainer.total_steps=2", "trainer.micro_batch_size=2", SMOOTH];
    let (a, b) = (scratch("one-dgpo"), scratch("two-dgpo"));
    single("dgpo_tiny.yaml", &a, &extra);
    two_ranks("dgpo_tiny.yaml", &b, &extra);
    // Gradients summed exactly: step 2's old adapter is the same in both layouts, so every
    // metric agrees at the usual tolerance.
    assert_same_run(&a, &b, 1..=2);
}

/// DiffusionOPD over two ranks: each rank's teacher replays its own rows, every step as one
/// process; two teachers split by prompt source.
#[test]
fn two_ranks_distil_as_one_process() {
    let teacher = flowtune_fixtures::shared!("teacher");
    let out = flowtune().args(["make-tiny", "sd3", "--seed", "7"]).arg(&teacher).output().unwrap();
    check(out, "make-tiny teacher");
    let teachers = format!(
        "model.teachers=[{{path: {}, data_source: nothing}}, {{path: {}, weight: 0.5}}]",
        pipeline().display(),
        teacher.display()
    );
    let extra = ["trainer.total_steps=2", "model.teacher_path=null", &teachers, SMOOTH];
    let (a, b) = (scratch("one-opd"), scratch("two-opd"));
    single("diffusion_opd_tiny.yaml", &a, &extra);
    two_ranks("diffusion_opd_tiny.yaml", &b, &extra);
    assert_same_run(&a, &b, 1..=2);
    assert!(metrics(&a)[0]["actor/distill_kl_loss"].as_f64().unwrap() > 0.0);
}

/// DMD2 over two ranks, plain and with the frozen base weights sharded: each rank's share of the
/// student's prompts and of each fake-score update's, every step as one process; a one-rank
/// checkpoint (the fake score's adapter and Adam state with it) resumes on two sharded ranks.
#[test]
fn two_ranks_train_dmd2_as_one_process_and_resume_it() {
    let val = format!("data.val_files=[{}]", root().join("examples/prompts/tiny.txt").display());
    let extra = ["trainer.total_steps=2", "trainer.val_freq=1", &val, SMOOTH];
    let frozen = [&extra[..], &["trainer.sharding=frozen"]].concat();
    let (a, b, c) = (scratch("one-dmd2"), scratch("two-dmd2"), scratch("two-frozen-dmd2"));
    single("dmd2_tiny.yaml", &a, &extra);
    two_ranks("dmd2_tiny.yaml", &b, &extra);
    assert_same_run(&a, &b, 1..=2);
    two_ranks("dmd2_tiny.yaml", &c, &frozen);
    assert_same_run(&a, &c, 1..=2);
    let resumed = scratch("resumed-dmd2");
    single("dmd2_tiny.yaml", &resumed, &[&extra[..], &["trainer.total_steps=1"]].concat());
    two_ranks("dmd2_tiny.yaml", &resumed, &frozen);
    assert_same_run(&a, &resumed, 1..=2);
}

/// Two ranks resume a one-rank checkpoint and train step 3 as the one-rank run does.
#[test]
fn two_ranks_resume_a_one_rank_run() {
    let (straight, split) = (scratch("straight"), scratch("split"));
    single("flow_grpo_tiny.yaml", &straight, &["trainer.total_steps=3", SMOOTH]);
    single("flow_grpo_tiny.yaml", &split, &["trainer.total_steps=2", SMOOTH]);
    two_ranks("flow_grpo_tiny.yaml", &split, &["trainer.total_steps=3", SMOOTH]);
    assert_same_run(&straight, &split, 1..=3);
}

/// `trainer.off_policy_lag: 1` (each step samples with the weights one update behind, the
/// single-process twin of rollout ranks beside the trainers): two ranks train as one process with
/// the whole batch, a one-rank checkpoint resumes on two ranks as the unbroken run, and the lag
/// shows where it must: step 1 is the synchronous run's, step 2's samples are step 1's weights'
/// (their log-probs drift from the recomputed old ones, which a synchronous step's do not).
#[test]
fn an_off_policy_lag_trains_as_one_process_and_resumes_at_another_world_size() {
    let lag = [
        "trainer.total_steps=3",
        "trainer.off_policy_lag=1",
        "rollout_correction.rollout_is=token",
        SMOOTH,
    ];
    let (one, two, split, sync) =
        (scratch("lag-one"), scratch("lag-two"), scratch("lag-split"), scratch("lag-sync"));
    single("flow_grpo_tiny.yaml", &one, &lag);
    two_ranks("flow_grpo_tiny.yaml", &two, &lag);
    assert_same_run(&one, &two, 1..=3);
    let first_two = [&lag[1..], &["trainer.total_steps=2"]].concat();
    single("flow_grpo_tiny.yaml", &split, &first_two);
    two_ranks("flow_grpo_tiny.yaml", &split, &lag);
    assert_same_run(&one, &split, 1..=3);
    single(
        "flow_grpo_tiny.yaml",
        &sync,
        &["trainer.total_steps=3", "rollout_correction.rollout_is=token", SMOOTH],
    );
    let (lagged, synced) = (metrics(&one), metrics(&sync));
    let at = |m: &[BTreeMap<String, serde_json::Value>], step: usize, key: &str| {
        m[step - 1][key].as_f64().unwrap_or_else(|| panic!("step {step}: no {key}"))
    };
    let staleness: Vec<f64> = (1..=3).map(|k| at(&lagged, k, "async/staleness")).collect();
    assert_eq!(staleness, [0.0, 1.0, 1.0]);
    assert!((1..=3).all(|k| at(&synced, k, "async/staleness") == 0.0));
    let reward = "critic/rewards/mean";
    assert_eq!(at(&lagged, 1, reward), at(&synced, 1, reward), "step 1 samples the start weights");
    assert_ne!(at(&lagged, 2, reward), at(&synced, 2, reward), "step 2 samples other weights");
    let drift = "rollout_corr/logprob_abs_diff_mean";
    for k in 2..=3 {
        let (off, on) = (at(&lagged, k, drift), at(&synced, k, drift));
        assert!(off > 100.0 * on && off > 1e-6, "step {k}: lagged drift {off:e}, on-policy {on:e}");
    }
    assert_eq!(at(&lagged, 1, drift), at(&synced, 1, drift), "step 1 is on-policy");
    // Full fine-tuning, the blocks sharded over two ranks: the lagged copy is kept in slices.
    let full = ["model.finetune=full", "trainer.lr=1e-4", "trainer.gradient_checkpointing=true"];
    let (whole, sharded) = (scratch("lag-full-one"), scratch("lag-full-two"));
    single("flow_grpo_tiny.yaml", &whole, &[&lag[..], &full].concat());
    two_ranks(
        "flow_grpo_tiny.yaml",
        &sharded,
        &[&lag[..], &full, &["trainer.sharding=full"]].concat(),
    );
    assert_same_run(&whole, &sharded, 1..=3);
    assert_eq!(exported(&whole), exported(&sharded), "not bit-identical");
}

/// A job split into one rollout rank and two training ranks (`trainer.rollout_ranks: 1`), or two
/// and one, trains as one process: with `off_policy_lag: 1` as the lagged single process, with
/// lag 0 as the synchronous one; a split checkpoint resumes in a plain two-rank job as the
/// unbroken run, and a plain checkpoint resumes split.
#[test]
fn rollout_ranks_train_as_one_process_and_resume_in_another_split() {
    let lag = ["trainer.off_policy_lag=1", "rollout_correction.rollout_is=token", SMOOTH];
    let three = [&lag[..], &["trainer.total_steps=3"]].concat();
    fn split<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        [extra, &["trainer.rollout_ranks=1"]].concat()
    }
    let (one, apart) = (scratch("split-one"), scratch("split-apart"));
    single("flow_grpo_tiny.yaml", &one, &three);
    ranks(3, "flow_grpo_tiny.yaml", &apart, &split(&three));
    assert_same_run(&one, &apart, 1..=3);
    assert!(metrics(&apart).iter().all(|l| l["dist/world_size"] == 2.0), "two training ranks");
    let waited = |m: &BTreeMap<String, serde_json::Value>| m.contains_key("timing_s/rollout_wait");
    assert!(metrics(&apart).iter().all(waited));
    // Two rollout ranks and one training rank, which stitches its rows from both shares.
    let stitched = scratch("split-two-rollout");
    let two_rollout = [&three[..], &["trainer.rollout_ranks=2"]].concat();
    ranks(3, "flow_grpo_tiny.yaml", &stitched, &two_rollout);
    assert_same_run(&one, &stitched, 1..=3);
    // Lag 0: the rollout rank waits for each update, which is the synchronous run.
    let sync = ["trainer.total_steps=2", SMOOTH];
    let (plain, waiting) = (scratch("split-sync-one"), scratch("split-sync"));
    single("flow_grpo_tiny.yaml", &plain, &sync);
    ranks(3, "flow_grpo_tiny.yaml", &waiting, &split(&sync));
    assert_same_run(&plain, &waiting, 1..=2);
    // Resumes across splits: split for two steps, plain two ranks for the third; and back.
    let (there, back) = (scratch("split-there"), scratch("split-back"));
    let two = [&lag[..], &["trainer.total_steps=2"]].concat();
    ranks(3, "flow_grpo_tiny.yaml", &there, &split(&two));
    two_ranks("flow_grpo_tiny.yaml", &there, &three);
    assert_same_run(&one, &there, 1..=3);
    single("flow_grpo_tiny.yaml", &back, &two);
    ranks(3, "flow_grpo_tiny.yaml", &back, &split(&three));
    assert_same_run(&one, &back, 1..=3);
    // Stopping early (here out of time after the first step), the training ranks take the step
    // the rollout rank sampled meanwhile, or none without a lag, and stop it: every rank exits.
    for lag in ["trainer.off_policy_lag=1", "trainer.off_policy_lag=0"] {
        let out = scratch(&format!("split-stop-{lag}"));
        let early = [lag, "trainer.time_limit_s=0.001", "trainer.total_steps=3", SMOOTH];
        ranks(3, "flow_grpo_tiny.yaml", &out, &split(&early));
        assert_eq!(metrics(&out).len(), 1, "{lag}: one step, then the time limit");
        assert!(out.join("checkpoints/step_000001/state.json").exists());
    }
}

/// Full fine-tuning with the Adam moments sharded over two ranks trains as one process does,
/// each rank saving its share; one process resumes from that checkpoint.
#[test]
fn a_sharded_optimizer_trains_as_one_and_resumes_with_another_world_size() {
    let full = ["model.finetune=full", "trainer.lr=1e-4", SMOOTH];
    let (straight, split) = (scratch("full-straight"), scratch("full-split"));
    single("flow_grpo_tiny.yaml", &straight, &[&full[..], &["trainer.total_steps=3"]].concat());
    two_ranks("flow_grpo_tiny.yaml", &split, &[&full[..], &["trainer.total_steps=2"]].concat());
    let moments = |ckpt: &Path, file: &str| -> BTreeSet<String> {
        let all =
            Tensor::read_safetensors(ckpt.join("checkpoints/step_000002").join(file)).unwrap();
        all.into_iter().map(|(n, _)| n).filter(|n| n.starts_with("exp_avg")).collect()
    };
    let whole = moments(&straight, "optimizer.safetensors");
    let (zero, one) =
        (moments(&split, "optimizer.safetensors"), moments(&split, "optimizer.rank1.safetensors"));
    assert!(!zero.is_empty() && !one.is_empty(), "each rank keeps a share of the moments");
    assert!(zero.is_disjoint(&one), "a weight's moments are kept by one rank");
    assert_eq!(&zero | &one, whole, "the shares make up the one-process state");
    single("flow_grpo_tiny.yaml", &split, &[&full[..], &["trainer.total_steps=3"]].concat());
    assert_same_run(&straight, &split, 1..=3);
}

/// LoRA with every block's frozen weights sharded over 2, 3 and 4 ranks trains bit for bit as one
/// process with the whole batch (gradients summed exactly), and each rank keeps 1/N of the
/// blocks' weights; a 4-rank checkpoint resumes at 2 ranks and at 1 as an unbroken run.
#[test]
fn sharded_frozen_weights_train_as_one_process_and_resume_at_other_world_sizes() {
    check_sharding("frozen", &[], &["trainer.sharding=frozen"]);
}

/// Full fine-tuning with every block's weights, gradients and moments sharded over 2, 3 and 4
/// ranks trains bit for bit as one process that recomputes its blocks' activations as sharded
/// blocks do (checkpointing changes the order in which a shared input's gradient is summed), and
/// a 4-rank checkpoint resumes at 2 ranks and at 1 as an unbroken run. The checkpoint holds
/// whole weights by name, as one process's does.
#[test]
fn fully_sharded_weights_train_as_one_process_and_resume_at_other_world_sizes() {
    let full = ["model.finetune=full", "trainer.lr=1e-4", "trainer.gradient_checkpointing=true"];
    check_sharding("full", &full, &["trainer.sharding=full"]);
}

/// `trainer.offload` keeps the trained state in host memory with the update's arithmetic
/// unchanged: the Adam moments, f32 masters and EMA (`optimizer`, one process), and also the
/// sharded blocks' slices and gradient sums (`all`: 2 ranks, and one process that shards its
/// blocks over itself; fully sharded and frozen-sharded LoRA) train bit for bit as the same runs
/// with everything on the device. On a CPU the host is
/// the device, so this checks the code paths and the arithmetic, not the transfers.
#[test]
fn offloaded_state_trains_as_resident_state() {
    let full = [
        SMOOTH,
        "model.finetune=full",
        "model.dtype=bf16",
        "trainer.f32_master_weights=true",
        "trainer.lr=1e-4",
        "trainer.gradient_checkpointing=true",
        "trainer.ema_decay=0.9",
        "trainer.total_steps=2",
    ];
    let lora = [SMOOTH, "trainer.ema_decay=0.9", "trainer.total_steps=2"];
    // One process shards its blocks over itself when their slices go to the host; it runs as
    // one that recomputes its blocks' activations (f32, so that both sum gradients alike).
    let alone = [&full[..], &["model.dtype=f32", "trainer.f32_master_weights=false"]].concat();
    let lora_ckpt = [&lora[..], &["trainer.gradient_checkpointing=true"]].concat();
    let runs: [(&str, &[&str], &[&str], usize); 5] = [
        ("optimizer", &full, &["trainer.offload=optimizer"], 1),
        ("full", &full, &["trainer.sharding=full", "trainer.offload=all"], 2),
        ("frozen", &lora, &["trainer.sharding=frozen", "trainer.offload=all"], 2),
        ("full-alone", &alone, &["trainer.sharding=full", "trainer.offload=all"], 1),
        ("frozen-alone", &lora_ckpt, &["trainer.sharding=frozen", "trainer.offload=all"], 1),
    ];
    for (name, base, offload, n) in runs {
        let resident = scratch(&format!("offload-{name}-resident"));
        let host = scratch(&format!("offload-{name}-host"));
        let on_host = [base, offload].concat();
        match n {
            1 => {
                single("flow_grpo_tiny.yaml", &resident, base);
                single("flow_grpo_tiny.yaml", &host, &on_host);
                if offload.len() > 1 {
                    let sharded = metrics(&host).pop().unwrap()["dist/sharded_weights_gb"].clone();
                    assert!(sharded.as_f64().unwrap() > 0.0, "{name}: no sharded blocks");
                }
            }
            _ => {
                let sharded = [base, &offload[..1]].concat();
                ranks(n, "flow_grpo_tiny.yaml", &resident, &sharded);
                ranks(n, "flow_grpo_tiny.yaml", &host, &on_host);
            }
        }
        assert_same_run(&resident, &host, 1..=2);
        assert_eq!(exported(&resident), exported(&host), "{name}: not bit-identical");
        if name == "full" {
            // Each block is written whole by one rank, in its own pair of files; the weights
            // file holds only the rest.
            let ckpt = host.join("checkpoints/step_000002");
            let mut files: Vec<String> = std::fs::read_dir(ckpt.join("blocks"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            files.sort();
            let tiny_blocks = 2;
            assert_eq!(files.len(), 2 * tiny_blocks, "{files:?}");
            assert!(files.contains(&"transformer_blocks.1.state.safetensors".into()), "{files:?}");
            let rest = Tensor::read_safetensors(ckpt.join("transformer.safetensors")).unwrap();
            assert!(rest.iter().all(|(n, _)| !n.starts_with("transformer_blocks.")));
            let block = Tensor::read_safetensors(
                ckpt.join("blocks/transformer_blocks.0.state.safetensors"),
            )
            .unwrap();
            for prefix in ["exp_avg.", "exp_avg_sq.", "master.", "ema."] {
                assert!(block.iter().any(|(n, _)| n.starts_with(prefix)), "no {prefix}");
            }
            // The offloaded checkpoint resumes as an unbroken resident run. (A bf16 model sums
            // its sharded gradients in f32, one process in bf16: the layouts' bf16 runs differ
            // in the last bits, so both runs here are sharded.)
            let three = [&full[..full.len() - 1], &["trainer.total_steps=3"]].concat();
            let straight = scratch("offload-straight");
            ranks(n, "flow_grpo_tiny.yaml", &straight, &[&three[..], &offload[..1]].concat());
            ranks(n, "flow_grpo_tiny.yaml", &host, &[&three[..], offload].concat());
            assert_same_run(&straight, &host, 1..=3);
            assert_eq!(exported(&straight), exported(&host), "resumed: not bit-identical");
        }
    }
}

/// One process and `sharding` at 2, 3 and 4 ranks train alike for 2 steps; 4-rank checkpoints
/// resume at 2 ranks and at 1 for a third step as an unbroken one-process run. `base` applies to
/// every run.
fn check_sharding(name: &str, base: &[&str], sharding: &[&str]) {
    let dir = scratch("prompts");
    let prompts = dir.join("twelve.txt");
    let lines: Vec<String> = (0..12).map(|i| format!("a shape number {i}")).collect();
    std::fs::write(&prompts, lines.join("\n")).unwrap();
    let data = format!("data.train_files=[{}]", prompts.display());
    // Validation after every step on 4 prompts: 3 ranks sample 1, 1 and 2 of them, the short
    // shares padded so that every rank joins every gather.
    let val = format!("data.val_files=[{}]", root().join("examples/prompts/tiny.txt").display());
    // 12 prompt groups a step, 2 per optimizer step: every world size gets whole micro-batches,
    // and with 3 or 4 ranks some own none of a mini-batch (they repeat a pass at weight 0).
    let common = [
        &[SMOOTH, &data, &val, "trainer.val_freq=1"],
        &["data.prompts_per_step=12", "trainer.ppo_mini_batch_size=2"][..],
        base,
    ]
    .concat();
    let two = [&common[..], &["trainer.total_steps=2"]].concat();
    let sharded = [&two[..], sharding].concat();
    let one = scratch(&format!("{name}-one"));
    single("flow_grpo_tiny.yaml", &one, &two);
    let mut kept = vec![];
    for n in [2, 3, 4] {
        let out = scratch(&format!("{name}-{n}"));
        ranks(n, "flow_grpo_tiny.yaml", &out, &sharded);
        assert_same_run(&one, &out, 1..=2);
        assert_eq!(exported(&one), exported(&out), "{n} ranks: the weights are not bit-identical");
        let last = metrics(&out).pop().unwrap();
        assert!(last.keys().any(|k| k.starts_with("val-core/")), "{n} ranks validated");
        kept.push((n, last["dist/sharded_weights_gb"].as_f64().unwrap()));
    }
    // Each rank's slices: the blocks' weights over N, plus at most one element of padding each.
    let whole = kept[0].1 * 2.0;
    for (n, gb) in kept {
        assert!((gb * n as f64 - whole).abs() <= 1e-4 * whole, "{n} ranks keep {gb} GB of {whole}");
    }
    // Resume a 4-rank checkpoint at 2 ranks and at 1 for a third step.
    let straight = scratch(&format!("{name}-straight"));
    let three = [&common[..], &["trainer.total_steps=3"]].concat();
    single("flow_grpo_tiny.yaml", &straight, &three);
    for n in [2, 1] {
        let out = scratch(&format!("{name}-resume-{n}"));
        ranks(4, "flow_grpo_tiny.yaml", &out, &sharded);
        match n {
            1 => single("flow_grpo_tiny.yaml", &out, &three),
            _ => ranks(n, "flow_grpo_tiny.yaml", &out, &[&three[..], sharding].concat()),
        }
        assert_same_run(&straight, &out, 1..=3);
        assert_eq!(exported(&straight), exported(&out), "resumed at {n}: not bit-identical");
    }
}

/// Rank 1 is killed after the first checkpoint: rank 0 stops with an error well within the
/// collective timeout, and one process resumes from the checkpoint it left.
#[test]
fn a_dead_rank_stops_the_job_and_leaves_a_loadable_checkpoint() {
    dead_rank("none", &["trainer.sharding=none"], 2, 1);
    dead_rank("frozen", &["trainer.sharding=frozen"], 2, 1);
    // Its checkpoint's blocks are written by both ranks.
    dead_rank("full", &["trainer.sharding=full", "model.finetune=full", "trainer.lr=1e-4"], 2, 1);
}

/// In a job of one rollout rank and two training ranks, the rollout rank dies, or a training rank
/// does: the others stop with a clear error, and the last checkpoint resumes.
#[test]
fn a_dead_rollout_or_training_rank_stops_a_split_job() {
    let split = ["trainer.rollout_ranks=1", "trainer.off_policy_lag=1"];
    dead_rank("rollout", &split, 3, 0);
    dead_rank("training", &split, 3, 2);
}

/// Rank `dead` of a job of `world` ranks with the overrides `extra` dies after the first
/// checkpoint: every other rank stops with an error that names the collective and the resume, and
/// one process resumes from the newest complete checkpoint.
fn dead_rank(name: &str, extra: &[&str], world: usize, dead: usize) {
    let out = scratch(&format!("dead-{name}"));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let args =
        train_args("flow_grpo_tiny.yaml", &out, &[&["trainer.total_steps=50"], extra].concat());
    let mut ranks: Vec<_> = (0..world)
        .map(|rank| {
            flowtune()
                .args(&args)
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let first = out.join("checkpoints/step_000001/state.json");
    let waited = Instant::now();
    while !first.exists() {
        assert!(waited.elapsed() < Duration::from_secs(600), "no checkpoint after 10 minutes");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut killed = ranks.remove(dead);
    killed.kill().unwrap();
    killed.wait().unwrap();
    let killed = Instant::now();
    for (survivor, rank) in ranks.into_iter().zip((0..world).filter(|&r| r != dead)) {
        let survivor = survivor.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&survivor.stderr);
        assert!(!survivor.status.success(), "rank {rank} went on without rank {dead}: {stderr}");
        let took = killed.elapsed();
        assert!(took < Duration::from_secs(60 + 30), "rank {rank} took {took:?}");
        // Sharded blocks meet the dead rank inside a model call, which names the collective.
        let said = format!("rank {rank}: error: ");
        assert!(stderr.contains(&said) && stderr.contains("distributed: "), "{stderr}");
        assert!(stderr.contains("trainer.resume: auto"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    // The newest complete checkpoint loads: one process resumes from it and finishes.
    let single_extra: Vec<&str> =
        extra.iter().copied().filter(|o| !o.starts_with("trainer.rollout_ranks")).collect();
    let resumed = flowtune()
        .args(train_args(
            "flow_grpo_tiny.yaml",
            &out,
            &[&["trainer.total_steps=3"], &single_extra[..]].concat(),
        ))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&resumed.stderr).to_string();
    check(resumed, "resume after the dead rank");
    assert!(text.contains("resumed from"), "{text}");
}

/// torchrun starts the ranks as `flowtune launch` does. This is also the test of the JPEG reward
/// across ranks: its first step (samples and rewards before any update) equals one process's.
#[test]
fn torchrun_launches_the_binary() {
    let venv = std::env::var("FLOWTUNE_VENV").map(PathBuf::from).unwrap_or_else(|_| {
        PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/flowtune/venv")
    });
    let torchrun = venv.join("bin/torchrun");
    if !torchrun.exists() {
        eprintln!("skipped: no torchrun at {}", torchrun.display());
        return;
    }
    let (one, two) = (scratch("torchrun-one"), scratch("torchrun-two"));
    single("flow_grpo_tiny.yaml", &one, &["trainer.total_steps=1"]);
    let out = Command::new(torchrun)
        .args(["--standalone", "--nproc-per-node", "2", "--no-python"])
        .arg(env!("CARGO_BIN_EXE_flowtune"))
        .args(train_args("flow_grpo_tiny.yaml", &two, &["trainer.total_steps=1"]))
        .env("GLOO_SOCKET_IFNAME", "lo")
        .output()
        .unwrap();
    check(out, "torchrun");
    assert_same_run(&one, &two, 1..=1);
}

#[test]
fn launch_stops_on_a_failed_rank_and_names_it() {
    let out = flowtune()
        .args(["launch", "--nproc", "2", "--", "train", "/nonexistent/recipe.yaml"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for needle in ["rank 0: error:", "rank 1: error:", "/nonexistent/recipe.yaml", "of 2 failed"] {
        assert!(stderr.contains(needle), "`{needle}` missing from: {stderr}");
    }
}
