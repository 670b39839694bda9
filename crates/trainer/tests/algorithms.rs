//! Every algorithm end to end on a make-tiny SD3 pipeline (CPU), from its `examples/*_tiny.yaml`
//! recipe: finite metrics, a changed LoRA, and each algorithm's own invariant.

mod common;

use common::{
    gardo_overrides, load_recipe, lora_moved, pipeline, root, scratch, teacher_pipeline, tensors,
};
use flowtune_fixtures::Scratch;
use flowtune_models::PipelineOptions;
use flowtune_objectives::Metrics;
use flowtune_rollout::Engine;
use flowtune_trainer::{train, TrainSummary};
use tch::Device;

/// Runs `examples/<file>` for `steps` steps; checks that every metric is finite and the LoRA
/// moved.
fn run(file: &str, name: &str, steps: u64, extra: &[&str]) -> (TrainSummary, Scratch) {
    let out = scratch(name);
    let mut overrides = vec![format!("trainer.total_steps={steps}"), "trainer.save_freq=1".into()];
    overrides.extend(extra.iter().map(|s| s.to_string()));
    let recipe = load_recipe(file, &out, &overrides).expect("recipe");
    let summary = train(&recipe, Device::Cpu).expect("train");
    assert_eq!(summary.metrics.len() as u64, steps);
    for m in &summary.metrics {
        let bad: Vec<_> = m.iter().filter(|(_, v)| !v.is_finite()).collect();
        assert!(bad.is_empty(), "{file}: non-finite metrics {bad:?}");
    }
    assert!(lora_moved(&tensors(&summary.export)), "{file}: the LoRA changed");
    (summary, out)
}

fn has(m: &Metrics, keys: &[&str]) {
    for k in keys {
        assert!(m.contains_key(*k), "missing {k}: {m:?}");
    }
}

#[test]
fn mix_grpo_trains_exactly_its_sliding_window() {
    let (summary, _out) = run("mix_grpo_tiny.yaml", "mix", 3, &[]);
    // progressive, W = 1 in [0, 5), iters_per_group 1: start = min(k, 4) at step k.
    let starts: Vec<f64> = summary.metrics.iter().map(|m| m["rollout/window_start"]).collect();
    assert_eq!(starts, [1.0, 2.0, 3.0]);
    // The rollout records (and the trainer replays) exactly the window's steps.
    let recipe = load_recipe("mix_grpo_tiny.yaml", &scratch("mix-engine"), &[]).unwrap();
    let pipe =
        flowtune_models::load_pipeline(pipeline(), &PipelineOptions::new(Device::Cpu)).unwrap();
    let shape = pipe.latent_shape(32, 32).unwrap();
    let engine = Engine::new(pipe.as_ref(), &recipe.rollout, shape, recipe.seed).unwrap();
    let batch = engine.rollout(&["a", "b"], &["", ""], &[], &engine.row_seeds(2, 2), 2).unwrap();
    assert!(batch.windows.iter().all(|w| *w == (2..3)));
    assert_eq!(batch.trajectory.all_log_probs.size(), [2, 1]);
    let t = Vec::<f32>::try_from(batch.trajectory.all_timesteps.flatten(0, -1)).unwrap();
    assert_eq!(t, [engine.grid.timesteps[2]; 2]);
}

#[test]
fn dance_grpo_samples_with_the_dance_sde() {
    let (summary, _out) = run("dance_grpo_tiny.yaml", "dance", 2, &[]);
    let first = &summary.metrics[0];
    assert!((first["actor/ratio_mean"] - 1.0).abs() <= 1e-6, "on-policy at step 1: {first:?}");
}

#[test]
fn grpo_guard_and_flow_dppo_use_the_old_policy_means() {
    let (guard, _out) = run("grpo_guard_tiny.yaml", "guard", 2, &[]);
    has(&guard.metrics[0], &["actor/pg_clipfrac", "rollout_corr/logprob_abs_diff_max"]);
    let (dppo, _out) = run("flow_dppo_tiny.yaml", "dppo", 2, &[]);
    has(&dppo.metrics[0], &["actor/masked_fraction"]);
    // Nothing has moved at step 1: the divergence is 0 and no sample is masked.
    assert_eq!(dppo.metrics[0]["actor/masked_fraction"], 0.0);
}

#[test]
fn online_dpo_trains_on_best_worst_pairs() {
    // A smooth reward: two JPEG sizes of one prompt's samples could tie and lose the pair.
    let (summary, _out) =
        run("dpo_tiny.yaml", "dpo", 2, &["reward.functions=[{name: brightness}]"]);
    let first = &summary.metrics[0];
    has(first, &["actor/dpo_loss", "actor/implicit_acc", "actor/rewards/margins"]);
    // Policy = reference before the first update: z = 0, loss = log 2.
    assert!((first["actor/dpo_loss"] - std::f64::consts::LN_2).abs() < 1e-6, "{first:?}");
    assert_eq!(first["critic/dpo_pairs"], 2.0, "one pair per prompt");
}

#[test]
fn offline_dpo_reads_pairs_of_images() {
    let pairs = root().join("examples/shapes/pairs/pairs.jsonl");
    let files = format!("data.preference_files=[{}]", pairs.display());
    let (summary, _out) = run("dpo_tiny.yaml", "dpo-offline", 2, &[&files]);
    assert_eq!(summary.metrics[0]["critic/dpo_pairs"], 2.0);
    assert!((summary.metrics[0]["actor/dpo_loss"] - std::f64::consts::LN_2).abs() < 1e-6);
}

#[test]
fn diffusion_nft_old_adapter_copies_or_lags_the_policy() {
    let old_and_policy = |out: &std::path::Path| {
        let ckpt = out.join("checkpoints/step_000002");
        let (state, lora) = (
            tensors(&ckpt.join("optimizer.safetensors")),
            tensors(&ckpt.join("adapters.safetensors")),
        );
        let pairs: Vec<_> = lora
            .iter()
            .map(|(k, t)| {
                (
                    state[&format!("old.{}", k.trim_start_matches("transformer."))].shallow_clone(),
                    t.shallow_clone(),
                )
            })
            .collect();
        assert!(!pairs.is_empty());
        pairs
    };
    let (summary, out) =
        run("diffusion_nft_tiny.yaml", "nft-copy", 2, &["actor.old_policy_decay=copy"]);
    has(&summary.metrics[0], &["actor/loss_positive", "actor/loss_negative", "actor/kl_loss"]);
    assert!(old_and_policy(&out).iter().all(|(old, theta)| old.equal(theta)), "copy: old = θ");
    let (summary, out) = run("diffusion_nft_tiny.yaml", "nft-ema", 2, &[]);
    assert!((summary.metrics[1]["actor/old_policy_decay"] - 0.002).abs() < 1e-12);
    let pairs = old_and_policy(&out);
    assert!(pairs.iter().any(|(old, theta)| !old.equal(theta)), "EMA: old lags θ");
    let b_moved = pairs.iter().any(|(old, _)| old.abs().max().double_value(&[]) > 0.0);
    assert!(b_moved, "the old adapter follows θ away from its start");
}

#[test]
fn bypass_skips_the_recompute_and_correction_weighs_it() {
    let (bypass, _out) = run("flow_grpo_tiny.yaml", "bypass", 1, &["trainer.old_log_prob=bypass"]);
    assert!(!bypass.metrics[0].contains_key("rollout_corr/logprob_abs_diff_mean"));
    let (corrected, _out) = run(
        "flow_grpo_tiny.yaml",
        "corrected",
        1,
        &["rollout_correction.rollout_is=token", "rollout_correction.rollout_rs=sequence"],
    );
    let m = &corrected.metrics[0];
    // The rollout and the recompute agree: every weight is 1 and nothing is rejected.
    assert!((m["rollout_corr/rollout_is_mean"] - 1.0).abs() < 1e-4, "{m:?}");
    assert_eq!(m["rollout_corr/rollout_rs_masked_fraction"], 0.0);
    assert!(m["rollout_corr/logprob_abs_diff_max"] <= 1e-5);
}

#[test]
fn diffusion_nft_resumes_to_the_same_weights() {
    let steps = |out: &std::path::Path, n: u64| {
        let overrides = [format!("trainer.total_steps={n}"), "trainer.save_freq=1".into()];
        let recipe = load_recipe("diffusion_nft_tiny.yaml", out, &overrides).unwrap();
        train(&recipe, Device::Cpu).expect("train")
    };
    let straight = scratch("nft-straight");
    let through = steps(&straight, 3).export;
    let resumed = scratch("nft-resumed");
    steps(&resumed, 2);
    let again = steps(&resumed, 3);
    assert_eq!(again.steps_run, 1, "resumed from step 2");
    let (a, b) = (tensors(&through), tensors(&again.export));
    assert!(a.iter().all(|(k, t)| t.equal(&b[k])), "the old adapter and loader state carry over");
}

#[test]
fn gardo_is_on_policy_and_resets_its_anchor() {
    let mut extra = gardo_overrides("brightness");
    extra.push("actor.gardo_reset_interval=1".into());
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let (summary, out) = run("gardo_tiny.yaml", "gardo", 3, &extra);
    let first = &summary.metrics[0];
    has(
        first,
        &["actor/kl_perc", "actor/gated_fraction", "critic/diversity/mean", "actor/kl_loss"],
    );
    assert!((first["actor/ratio_mean"] - 1.0).abs() <= 1e-6, "on-policy at step 1: {first:?}");
    assert!(first["rollout_corr/logprob_abs_diff_max"] <= 1e-5);
    // The anchor starts as the policy: no KL before the first update.
    assert_eq!(first["actor/kl_loss"], 0.0);
    // Reset interval 1: the anchor is set again before step 3 (3 − 1 − 0 > 1), to the weights
    // after step 2.
    let resets: Vec<f64> = summary.metrics.iter().map(|m| m["actor/ref_reset"]).collect();
    assert_eq!(resets, [0.0, 0.0, 1.0]);
    // A gated sample is pulled towards the lagging anchor at step 2, not after the reset.
    let kl: Vec<f64> = summary.metrics.iter().map(|m| m["actor/kl_loss"]).collect();
    assert!(summary.metrics[1]["actor/gated_fraction"] > 0.0 && kl[1] > 0.0, "{kl:?}");
    assert_eq!(kl[2], 0.0);
    let ckpt = |k: u64| out.join(format!("checkpoints/step_{k:06}"));
    let anchor = |k: u64| tensors(&ckpt(k).join("optimizer.safetensors"));
    let (before, after) = (anchor(2), anchor(3));
    let policy2 = tensors(&ckpt(2).join("adapters.safetensors"));
    for (key, t) in &policy2 {
        let name = format!("old.{}", key.trim_start_matches("transformer."));
        assert!(after[&name].equal(t), "{name}: the anchor after the reset is step 2's policy");
        if key.contains("lora_B") {
            assert_eq!(before[&name].abs().max().double_value(&[]), 0.0, "{name}: still the start");
        }
    }
}

#[test]
fn dgpo_weighs_whole_groups_and_its_old_adapter_follows() {
    // Smooth rewards: the two samples of a prompt differ, so every group has a signal.
    let (summary, out) =
        run("dgpo_tiny.yaml", "dgpo", 2, &["reward.functions=[{name: brightness}]"]);
    let first = &summary.metrics[0];
    has(first, &["actor/dsm_loss", "actor/group_weight_mean", "actor/clip_frac", "actor/kl_loss"]);
    // Before the first update policy = old = reference: every group score is 0, so every weight
    // is σ(0) = ½, the trust region holds and the reference MSE is 0.
    assert!((first["actor/group_weight_mean"] - 0.5).abs() < 1e-6, "{first:?}");
    assert!(first["actor/group_weight_dev"] < 1e-6, "{first:?}");
    assert_eq!(first["actor/clip_frac"], 0.0);
    assert!(first["actor/kl_loss"].abs() < 1e-12, "{first:?}");
    // linear_to_0_3: d = 0.001·k, so the old adapter lags θ after step 2.
    assert!((summary.metrics[1]["actor/old_policy_decay"] - 0.002).abs() < 1e-12);
    let ckpt = out.join("checkpoints/step_000002");
    let (state, lora) =
        (tensors(&ckpt.join("optimizer.safetensors")), tensors(&ckpt.join("adapters.safetensors")));
    let lags = lora
        .iter()
        .any(|(k, t)| !state[&format!("old.{}", k.trim_start_matches("transformer."))].equal(t));
    assert!(lags, "the old adapter lags θ");
}

/// GARDO (gate history, anchor and its pending reset), DGPO (old adapter, shared timesteps and
/// group noise) and DiffusionOPD resume to the same weights and metrics as a straight run.
#[test]
fn gardo_dgpo_and_diffusion_opd_resume_bit_for_bit() {
    let gardo = gardo_overrides("brightness");
    let teacher = vec![format!("model.teacher_path={}", teacher_pipeline().display())];
    for (file, extra) in [
        ("gardo_tiny.yaml", gardo),
        ("dgpo_tiny.yaml", vec![]),
        ("diffusion_opd_tiny.yaml", teacher),
    ] {
        let steps = |out: &std::path::Path, n: u64| {
            let mut overrides =
                vec![format!("trainer.total_steps={n}"), "trainer.save_freq=1".into()];
            overrides.extend(extra.iter().cloned());
            // GARDO: the anchor is reset before step 3, so the resumed step reads its saved state.
            overrides.push("actor.gardo_reset_interval=1".into());
            let recipe = load_recipe(file, out, &overrides).unwrap();
            train(&recipe, Device::Cpu).expect("train")
        };
        let straight = scratch(&format!("{file}-straight"));
        let whole = steps(&straight, 3);
        let resumed = scratch(&format!("{file}-resumed"));
        steps(&resumed, 2);
        let again = steps(&resumed, 3);
        assert_eq!(again.steps_run, 1, "{file}: resumed from step 2");
        let (a, b) = (tensors(&whole.export), tensors(&again.export));
        assert!(a.iter().all(|(k, t)| t.equal(&b[k])), "{file}: the same weights");
        common::assert_same_metrics(&format!("{file}: "), &whole.metrics[2], &again.metrics[0]);
    }
}

#[test]
fn dgpo_refuses_a_micro_batch_that_splits_a_group() {
    let err = load_recipe(
        "dgpo_tiny.yaml",
        &scratch("dgpo-split"),
        &["trainer.micro_batch_size=3".into()],
    )
    .unwrap_err();
    assert!(
        err.contains("trainer.micro_batch_size") && err.contains("multiple of rollout.n 2"),
        "{err}"
    );
}

#[test]
fn diffusion_opd_distils_from_its_teachers() {
    let teacher = format!("model.teacher_path={}", teacher_pipeline().display());
    let (summary, _out) = run("diffusion_opd_tiny.yaml", "opd", 2, &[&teacher]);
    let first = &summary.metrics[0];
    has(first, &["actor/distill_kl_loss", "timing_s/teacher", "critic/rewards/mean"]);
    // Other weights: a positive KL at step 1; no policy-gradient term.
    assert!(first["actor/distill_kl_loss"] > 0.0 && !first.contains_key("actor/pg_loss"));
    assert!(first["rollout_corr/logprob_abs_diff_max"] <= 1e-5, "on-policy at step 1");
    let kl = first["actor/distill_kl_loss"];
    // Several teachers: a prompt goes to the first whose data_source filter takes it, and its
    // KL counts with that teacher's weight. The student's base model as teacher gives 0.
    let student = pipeline().display().to_string();
    let other = teacher_pipeline().display().to_string();
    for (teachers, want) in [
        (format!("[{{path: {other}, data_source: ocr}}, {{path: {student}}}]"), 0.0),
        (
            format!("[{{path: {student}, data_source: ocr}}, {{path: {other}, weight: 2}}]"),
            2.0 * kl,
        ),
    ] {
        // (A zero KL leaves the LoRA where it was, so not through `run`.)
        let many = [
            "trainer.total_steps=1".into(),
            "model.teacher_path=null".into(),
            format!("model.teachers={teachers}"),
        ];
        let recipe = load_recipe("diffusion_opd_tiny.yaml", &scratch("opd-many"), &many).unwrap();
        let summary = train(&recipe, Device::Cpu).unwrap();
        let got = summary.metrics[0]["actor/distill_kl_loss"];
        assert!((got - want).abs() <= 1e-6 * want.abs() + 1e-12, "{teachers}: {got} vs {want}");
    }
    let recipe = load_recipe(
        "diffusion_opd_tiny.yaml",
        &scratch("opd-unrouted"),
        &[
            "model.teacher_path=null".into(),
            format!("model.teachers=[{{path: {other}, data_source: ocr}}]"),
        ],
    )
    .unwrap();
    let err = train(&recipe, Device::Cpu).unwrap_err().to_string();
    assert!(err.contains("no teacher takes prompts of data_source `tiny`"), "{err}");
}

#[test]
fn a_policy_gradient_loss_adds_the_distillation_kl() {
    let teacher = format!("model.teacher_path={}", teacher_pipeline().display());
    let extra = [teacher.as_str(), "actor.use_distill_loss=true", "actor.distill_loss_coef=0.5"];
    let (summary, _out) = run("flow_grpo_tiny.yaml", "grpo-opd", 2, &extra);
    let first = &summary.metrics[0];
    assert!((first["actor/ratio_mean"] - 1.0).abs() <= 1e-6, "on-policy at step 1: {first:?}");
    // actor/loss = pg + 0.5·KL (no reference KL here), step by step.
    let want = first["actor/pg_loss"] + 0.5 * first["actor/distill_kl_loss"];
    assert!((first["actor/loss"] - want).abs() <= 1e-6 * want.abs().max(1e-6), "{first:?}");
    let err = load_recipe(
        "flow_grpo_tiny.yaml",
        &scratch("grpo-no-teacher"),
        &["actor.use_distill_loss=true".into()],
    )
    .unwrap_err();
    assert!(err.contains("model.teacher_path"), "{err}");
}

/// Every tiny recipe in bf16 (transformer, text encoders and VAE; the LoRA and Adam state stay
/// f32): finite metrics, a LoRA that moves, and, for the policy-gradient recipes, a ratio within 1e-2 of
/// 1 at step 1 (bf16 replays round differently from the rollout's batch; f32 gives 1e-6).
#[test]
fn every_tiny_recipe_trains_in_bf16() {
    let bf16 = ["model.dtype=bf16", "model.frozen_dtype=bf16"];
    let gardo = gardo_overrides("jpeg_incompressibility");
    let teacher = format!("model.teacher_path={}", teacher_pipeline().display());
    for algorithm in [
        "flow_grpo",
        "mix_grpo",
        "dance_grpo",
        "grpo_guard",
        "flow_dppo",
        "dpo",
        "diffusion_nft",
        "gardo",
        "dgpo",
        "diffusion_opd",
        "dmd2",
    ] {
        let file = format!("{algorithm}_tiny.yaml");
        let mut extra: Vec<&str> = bf16.to_vec();
        if algorithm == "gardo" {
            extra.extend(gardo.iter().map(String::as_str));
        }
        if algorithm == "diffusion_opd" {
            extra.push(&teacher);
        }
        let (summary, _out) = run(&file, &format!("bf16-{algorithm}"), 2, &extra);
        if let Some(ratio) = summary.metrics[0].get("actor/ratio_mean") {
            assert!((ratio - 1.0).abs() <= 1e-2, "{algorithm}: ratio {ratio} at step 1");
        }
    }
}

/// DMD2: the student's and the fake score's updates each report their metrics; the fake score
/// keeps weights and Adam state of its own (saved beside the student's, which the EMA follows);
/// validation samples on the student's grid without CFG; and a resumed run trains step 3 as a
/// straight one does, bit for bit.
#[test]
fn dmd2_trains_its_student_and_fake_score_and_resumes_bit_for_bit() {
    let val = format!("data.val_files=[{}]", root().join("examples/prompts/tiny.txt").display());
    let steps = |out: &std::path::Path, n: u64| {
        let overrides = [
            format!("trainer.total_steps={n}"),
            "trainer.save_freq=1".into(),
            "trainer.val_freq=3".into(),
            val.clone(),
        ];
        train(&load_recipe("dmd2_tiny.yaml", out, &overrides).unwrap(), Device::Cpu).unwrap()
    };
    let straight = scratch("dmd2-straight");
    let whole = steps(&straight, 3);
    for m in &whole.metrics {
        has(m, &["dmd/loss", "dmd/normalizer", "dmd/gradient_norm", "dmd/rollout_exit"]);
        has(m, &["fake_score/loss", "fake_score/grad_norm", "actor/grad_norm"]);
        assert!(m["fake_score/loss"] > 0.0 && m["dmd/normalizer"] > 0.0, "{m:?}");
    }
    has(&whole.metrics[2], &["val-core/tiny/reward/mean@1"]);
    assert!(lora_moved(&tensors(&whole.export)), "the student trained");
    // The checkpoint keeps the fake score's adapter and its Adam moments beside the student's.
    let saved = tensors(&straight.join("checkpoints/step_000003/optimizer.safetensors"));
    let student = tensors(&straight.join("checkpoints/step_000003/adapters.safetensors"));
    let fake: Vec<_> = saved.iter().filter(|(k, _)| k.starts_with("fake_score.")).collect();
    assert_eq!(fake.len(), student.len(), "one fake-score tensor per adapter tensor");
    let moments = saved.keys().filter(|k| k.starts_with("fake_score_optim.exp_avg.")).count();
    assert_eq!(moments, student.len());
    let differs = fake.iter().any(|(k, t)| {
        let name = k.trim_start_matches("fake_score.");
        student.iter().any(|(s, w)| s.ends_with(name) && !w.equal(t))
    });
    assert!(differs, "the fake score's weights are its own");
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(straight.join("checkpoints/step_000003/state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["algorithm"]["fake_score_updates"], 6, "two fake-score updates a step");
    let resumed = scratch("dmd2-resumed");
    steps(&resumed, 2);
    let again = steps(&resumed, 3);
    assert_eq!(again.steps_run, 1);
    let (a, b) = (tensors(&whole.export), tensors(&again.export));
    assert!(a.iter().all(|(k, t)| t.equal(&b[k])), "the same student");
    common::assert_same_metrics("dmd2: ", &whole.metrics[2], &again.metrics[0]);
}
