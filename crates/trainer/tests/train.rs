//! The training loop end to end on a make-tiny SD3 pipeline (CPU): it trains, it is on-policy
//! before the first update, and model batching does not change the samples. (Resuming is tested
//! with separate processes, as it happens, in the CLI tests.)

mod common;

use common::{lora_moved, metric_lines, pipeline, recipe, root, scratch, tensors};
use flowtune_trainer::train;
use tch::Device;

#[test]
fn trains_end_to_end_and_is_on_policy_before_the_first_update() {
    let out = scratch("e2e");
    let val = format!("data.val_files=[{}]", root().join("examples/prompts/tiny.txt").display());
    let overrides = [
        "actor.use_kl_loss=true".into(),
        "trainer.total_steps=3".into(),
        "trainer.image_freq=2".into(),
        "trainer.val_freq=2".into(),
        "trainer.ema_decay=0.9".into(),
        val,
    ];
    let summary = train(&recipe(&out, &overrides), Device::Cpu).expect("train");
    assert_eq!(summary.metrics.len(), 3);
    for m in &summary.metrics {
        assert!(m.values().all(|v| v.is_finite()), "finite metrics: {m:?}");
    }
    // The whole batch is one mini-batch and one epoch: every ratio is taken before any update.
    let first = &summary.metrics[0];
    assert!(first["rollout_corr/logprob_abs_diff_max"] <= 1e-5, "{first:?}");
    assert!((first["actor/ratio_mean"] - 1.0).abs() <= 1e-6 && first["actor/ratio_std"] <= 1e-6);
    assert_eq!(first["actor/pg_clipfrac"], 0.0);
    // Adapters start at B = 0: policy = reference (up to the rounding of another row grouping).
    assert!(first["actor/kl_loss"].abs() <= 1e-10, "{first:?}");
    assert!(
        summary.metrics[2]["actor/kl_loss"] > 0.0,
        "after updates the policy leaves the reference"
    );
    // The LoRA changed, checkpoints and the exported adapter exist.
    let lora = tensors(&summary.export);
    assert!(lora_moved(&lora));
    assert!(out.join("checkpoints/step_000002/adapters.safetensors").exists());
    assert!(out.join("checkpoints/step_000003/state.json").exists());
    assert_eq!(metric_lines(&out).len(), 3);
    // The EMA lags the trained weights.
    let ema = tensors(&out.join("lora/ema_lora_weights.safetensors"));
    let lagging = lora.iter().filter(|(k, _)| k.contains("lora_B")).any(|(k, t)| !t.equal(&ema[k]));
    assert!(lagging, "EMA weights differ from the final ones");
    let events = std::fs::read_dir(out.join("tensorboard")).unwrap().count();
    assert_eq!(events, 1, "one TensorBoard event file");
    // Pictures: a training grid at step 2, validation grids at steps 2 and 3, captions beside them.
    for stem in ["train_step_000002", "val_step_000002", "val_step_000003"] {
        assert!(out.join(format!("images/{stem}.png")).exists(), "{stem}.png");
        assert!(
            std::fs::read_to_string(out.join(format!("images/{stem}.jsonl")))
                .unwrap()
                .lines()
                .count()
                >= 4
        );
    }
    let val = summary.metrics[1]["val-core/tiny/reward/mean@1"];
    assert!(val.is_finite() && val > 0.0, "{val}");
}

/// Text encoders and the VAE on the CPU (`model.offload`) train exactly as resident ones: the
/// same metrics and the same LoRA, bit for bit, at every step (validation included).
#[test]
fn offloaded_encoders_and_vae_train_as_resident_ones() {
    let run = |name: &str, offload: &str| {
        let out = scratch(name);
        let val =
            format!("data.val_files=[{}]", root().join("examples/prompts/tiny.txt").display());
        let overrides = [
            "trainer.total_steps=2".into(),
            "trainer.val_freq=1".into(),
            val,
            format!("model.offload={offload}"),
        ];
        let summary = train(&recipe(&out, &overrides), Device::Cpu).expect("train");
        (summary.metrics, tensors(&summary.export))
    };
    let ((resident, lora), (offloaded, again)) =
        (run("resident", "none"), run("offloaded", "encoders_and_vae"));
    for (a, b) in resident.iter().zip(&offloaded) {
        common::assert_same_metrics("", a, b);
    }
    assert!(resident[0].keys().any(|k| k.starts_with("val-core/")));
    for (name, t) in &lora {
        assert!(t.equal(&again[name]), "{name} differs with offloaded components");
    }
}

#[test]
fn bad_resolution_is_named() {
    let out = scratch("resolution");
    let err =
        train(&recipe(&out, &["model.resolution=30".into()]), Device::Cpu).unwrap_err().to_string();
    assert!(err.contains("model.resolution 30: expected a positive multiple of 4"), "{err}");
}

/// Rows through the model all at once or three at a time give the same samples: a matmul over
/// fewer rows may round differently, so they are compared through the smooth `brightness` reward
/// and the log-probs, at every step.
#[test]
fn model_batch_size_does_not_change_the_samples() {
    let run = |name: &str, batch: &str| {
        let out = scratch(name);
        let overrides =
            ["trainer.total_steps=2".into(), SMOOTH.into(), format!("rollout.batch_size={batch}")];
        train(&recipe(&out, &overrides), Device::Cpu).expect("train").metrics
    };
    let (whole, batched) = (run("batch-all", "0"), run("batch-3", "3"));
    for (a, b) in whole.iter().zip(&batched) {
        for key in ["critic/rewards/mean", "critic/rewards/max", "critic/rewards/min"] {
            assert!(close(a[key], b[key]), "{key}: {} vs {}", a[key], b[key]);
        }
        // The loss is near 0 on policy: the replays' log-probs round apart in f32 (another
        // batch of rows through the fused projections), 1e-8 at most.
        let (x, y) = (a["actor/loss"], b["actor/loss"]);
        assert!((x - y).abs() <= 1e-7, "actor/loss: {x} vs {y}");
        assert!(b["rollout_corr/logprob_abs_diff_max"] <= 1e-5);
    }
}

/// The reward of the tests that two runs are the same: smooth in the pixels, so that weights
/// differing in the last bits give rewards differing in the last bits.
const SMOOTH: &str = "reward.functions=[{name: brightness}]";

/// Equal within 1e-5 relative (1e-9 absolute).
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-5 * a.abs().max(b.abs()) + 1e-9
}

#[test]
fn full_fine_tuning_trains_every_weight_against_a_frozen_reference() {
    let out = scratch("full");
    let overrides = [
        "model.finetune=full".into(),
        "actor.use_kl_loss=true".into(),
        "trainer.total_steps=2".into(),
        "trainer.save_freq=1".into(),
    ];
    let summary = train(&recipe(&out, &overrides), Device::Cpu).expect("train");
    let first = &summary.metrics[0];
    assert!((first["actor/ratio_mean"] - 1.0).abs() <= 1e-6, "{first:?}");
    // The copy equals the policy before any update (up to another row grouping's rounding).
    assert!(first["actor/kl_loss"].abs() <= 1e-10, "{first:?}");
    assert!(summary.metrics[1]["actor/kl_loss"] > 0.0, "{:?}", summary.metrics[1]);
    // A diffusers transformer folder comes out; its weights moved, the position table did not.
    assert_eq!(summary.export, out.join("transformer/diffusion_pytorch_model.safetensors"));
    assert!(out.join("transformer/config.json").exists());
    let before = tensors(&pipeline().join("transformer/diffusion_pytorch_model.safetensors"));
    let after = tensors(&summary.export);
    assert_eq!(before.keys().collect::<Vec<_>>(), after.keys().collect::<Vec<_>>());
    let moved = after.iter().filter(|(k, t)| !t.equal(&before[*k])).count();
    assert!(moved > before.len() / 2, "{moved} of {} tensors changed", before.len());
    assert!(after["pos_embed.pos_embed"].equal(&before["pos_embed.pos_embed"]));
    // Checkpoints hold the weights; resuming in LoRA mode is refused with the reason.
    assert!(out.join("checkpoints/step_000001/transformer.safetensors").exists());
    let err = train(
        &recipe(&out, &["trainer.total_steps=3".into(), "trainer.resume=auto".into()]),
        Device::Cpu,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("holds full transformer weights, but model.finetune is lora"), "{err}");
}

#[test]
fn a_time_limit_stops_after_the_step_that_crosses_it_and_saves() {
    let out = scratch("time-limit");
    let overrides = ["trainer.total_steps=50".into(), "trainer.time_limit_s=0.001".into()];
    let summary = train(&recipe(&out, &overrides), Device::Cpu).expect("train");
    assert_eq!(summary.steps_run, 1);
    assert!(out.join("checkpoints/step_000001/state.json").exists());
}

/// Checkpointed blocks recompute their forward in backward: the same training at every step
/// (smooth reward), and the recomputation is counted in the model work. With the JPEG reward,
/// the first step (before any update) is the same too.
#[test]
fn gradient_checkpointing_trains_as_without_it() {
    let run_with = |name: &str, on: bool, reward: &str, steps: u64| {
        let out = scratch(name);
        let overrides = [
            format!("trainer.total_steps={steps}"),
            reward.into(),
            "actor.use_kl_loss=true".into(),
            "trainer.peak_tflops=0.5".into(),
            format!("trainer.gradient_checkpointing={on}"),
        ];
        let summary = train(&recipe(&out, &overrides), Device::Cpu).expect("train");
        (summary.metrics, tensors(&summary.export))
    };
    let run = |name: &str, on: bool| run_with(name, on, SMOOTH, 3);
    let before = flowtune_recompute::recomputed_blocks();
    let ((plain, lora), (checkpointed, again)) = (run("gc-off", false), run("gc-on", true));
    assert!(flowtune_recompute::recomputed_blocks() > before, "the blocks were recomputed");
    assert!(plain.iter().all(|m| m["perf/max_memory_rss_gb"] > 0.0), "peak memory is logged");
    // The counted model work (TFLOP/s × seconds) grows by the recomputed block forwards.
    let work = |m: &flowtune_objectives::Metrics| m["perf/tflops"] * m["timing_s/step"] * 1e12;
    for (a, b) in plain.iter().zip(&checkpointed) {
        assert!(work(a) > 0.0 && work(b) > 1.05 * work(a), "{} then {}", work(a), work(b));
    }
    for m in &plain {
        assert_eq!(m["perf/mfu"], m["perf/tflops"] / 0.5);
        assert_eq!(m["perf/mfu/actor"], m["perf/tflops/actor"] / 0.5);
        let actor = m["perf/tflops/actor"] * m["timing_s/update_actor"];
        assert!(actor > 0.0 && actor < m["perf/tflops"] * m["timing_s/step"], "a part of the step");
    }
    let same_steps = |plain: &[flowtune_objectives::Metrics],
                      other: &[flowtune_objectives::Metrics]| {
        for (step, (a, b)) in plain.iter().zip(other).enumerate() {
            for (key, x) in a {
                if !key.starts_with("perf/") && !key.starts_with("timing_s/") {
                    let y: f64 = b[key];
                    assert!(close(*x, y), "step {}: {key}: {x} vs {y}", step + 1);
                }
            }
        }
    };
    same_steps(&plain, &checkpointed);
    let jpeg = "reward.functions=[{name: jpeg_incompressibility}]";
    let (jpeg_plain, jpeg_checkpointed) =
        (run_with("gc-jpeg-off", false, jpeg, 1).0, run_with("gc-jpeg-on", true, jpeg, 1).0);
    same_steps(&jpeg_plain, &jpeg_checkpointed);
    for (name, t) in &lora {
        let diff = (t - &again[name]).norm().double_value(&[]);
        assert!(diff <= 1e-5 * t.norm().double_value(&[]) + 1e-9, "{name}: {diff:e}");
    }
}

/// Full fine-tuning in bf16 with f32 master weights: resuming from a checkpoint gives the weights
/// of the straight run bit for bit (the masters are checkpointed), and the masters change the
/// result (small steps are kept, not rounded away); under LoRA the key is refused by name.
#[test]
fn f32_master_weights_resume_bit_for_bit_and_keep_small_steps() {
    let run = |out: &std::path::Path, steps: u64, masters: bool| {
        let overrides = [
            "model.finetune=full".into(),
            "model.dtype=bf16".into(),
            "trainer.lr=1e-5".into(),
            "trainer.save_freq=1".into(),
            SMOOTH.into(),
            format!("trainer.total_steps={steps}"),
            format!("trainer.f32_master_weights={masters}"),
        ];
        tensors(&train(&recipe(out, &overrides), Device::Cpu).expect("train").export)
    };
    let straight = run(&scratch("master-straight"), 2, true);
    let resumed_dir = scratch("master-resumed");
    run(&resumed_dir, 1, true);
    let resumed = run(&resumed_dir, 2, true);
    for (name, t) in &straight {
        assert!(t.equal(&resumed[name]), "{name} differs after resuming");
    }
    let plain = run(&scratch("master-none"), 2, false);
    let differ = straight.iter().filter(|(n, t)| !t.equal(&plain[*n])).count();
    assert!(differ > 0, "f32 masters change what 1e-5 steps leave in bf16 weights");
    let lora = ["trainer.f32_master_weights=true".into()];
    let err = flowtune_config::Recipe::load(
        &root().join("examples/flow_grpo_tiny.yaml"),
        &[&lora[..], &[format!("model.path={}", pipeline().display())]].concat(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("trainer.f32_master_weights") && err.contains("model.finetune: full"),
        "{err}"
    );
}
