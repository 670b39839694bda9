//! Every algorithm on a tiny random Qwen-Image pipeline (CPU) through the unchanged trainer: each
//! `examples/*_tiny.yaml` pointed at `make-tiny qwen-image` with Qwen-Image's LoRA targets trains,
//! is on-policy before its first update (ratio 1, rollout ↔ replay log-prob drift 0), and resumes
//! to the same adapters and metrics.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::{lora_moved, root, scratch, tensors};
use flowtune_config::Recipe;
use flowtune_trainer::train;
use tch::Device;

/// One tiny Qwen-Image pipeline for every test of this binary.
fn pipeline() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch("qwen-image-pipeline");
        let family = flowtune_models::family_named("qwen_image").expect("qwen_image is built in");
        (family.write_tiny)(&dir, 5).expect("make-tiny qwen-image");
        dir
    })
}

/// `examples/<file>` on the tiny Qwen-Image pipeline with the Qwen-Image tiny recipe's targets.
fn recipe(file: &str, out: &Path, steps: u64, resume: &str) -> Recipe {
    let qwen = Recipe::load(&root().join("examples/flow_grpo_qwen_image_tiny.yaml"), &[])
        .expect("the Qwen-Image tiny recipe");
    let targets = qwen.model.lora.target_modules.join(", ");
    let overrides = [
        format!("model.path={}", pipeline().display()),
        format!("model.lora.target_modules=[{targets}]"),
        format!("data.train_files=[{}]", root().join("examples/prompts/tiny.txt").display()),
        format!("trainer.output_dir={}", out.display()),
        format!("trainer.total_steps={steps}"),
        "trainer.save_freq=1".into(),
        format!("trainer.resume={resume}"),
    ];
    Recipe::load(&root().join("examples").join(file), &overrides).expect("recipe")
}

#[test]
fn every_algorithm_trains_and_resumes_on_qwen_image() {
    for file in [
        "flow_grpo_qwen_image_tiny.yaml",
        "mix_grpo_tiny.yaml",
        "grpo_guard_tiny.yaml",
        "dance_grpo_tiny.yaml",
        "flow_dppo_tiny.yaml",
        "dpo_tiny.yaml",
        "diffusion_nft_tiny.yaml",
    ] {
        let name = file.trim_end_matches(".yaml");
        let straight = scratch(&format!("qwen-{name}"));
        let summary = train(&recipe(file, &straight, 2, "none"), Device::Cpu)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let first = &summary.metrics[0];
        assert!(first.values().all(|v| v.is_finite()), "{file}: {first:?}");
        if file.starts_with("flow_grpo") {
            for key in ["actor/ratio_mean", "rollout_corr/logprob_abs_diff_max"] {
                assert!(first.contains_key(key), "{file}: no {key} in {first:?}");
            }
        }
        if let Some(ratio) = first.get("actor/ratio_mean") {
            assert!((ratio - 1.0).abs() <= 1e-6, "{file}: on-policy at step 1: {first:?}");
        }
        if let Some(drift) = first.get("rollout_corr/logprob_abs_diff_max") {
            assert!(*drift <= 1e-5, "{file}: rollout ↔ replay drift {drift}");
        }
        let lora = tensors(&summary.export);
        assert!(lora_moved(&lora), "{file}: the LoRA trained");
        assert!(
            lora.keys().any(|k| k.contains("img_mlp.net.0.proj.lora_B")),
            "{file}: the feed-forward targets are adapted: {:?}",
            lora.keys()
        );

        let resumed = scratch(&format!("qwen-{name}-resumed"));
        train(&recipe(file, &resumed, 1, "none"), Device::Cpu).expect("first step");
        let again = train(&recipe(file, &resumed, 2, "auto"), Device::Cpu).expect("resumed");
        assert_eq!(again.steps_run, 1, "{file}: resumed from step 1");
        let after = tensors(&again.export);
        for (key, t) in &lora {
            assert!(t.equal(&after[key]), "{file}: {key} differs after resuming");
        }
        for (key, a) in &summary.metrics[1] {
            if key.starts_with("perf/") || key.starts_with("timing") {
                continue;
            }
            let b = again.metrics[0][key];
            assert!(a == &b || (a.is_nan() && b.is_nan()), "{file}: {key}: {a} vs {b} resumed");
        }
    }
}

/// Qwen-Image-Edit-Plus through the trainer: prompt rows carry condition pictures (`images`, or
/// `extra_info.image`), which reach the text encoder's vision tower and the image stream; the run
/// is on-policy at its first step and trains.
#[test]
fn edit_plus_trains_on_rows_with_condition_pictures() {
    use flowtune_models::qwen_image::{write_tiny_qwen_image, TinyQwenImageSpec};
    let dir = scratch("qwen-edit");
    let model = dir.join("pipeline");
    let spec = TinyQwenImageSpec { seed: 4, edit: true, zero_cond_t: true, ..Default::default() };
    write_tiny_qwen_image(&model, &spec).expect("make-tiny qwen-image --edit");
    for (name, shade) in [("a.png", 40u8), ("b.png", 200)] {
        let picture = image::RgbImage::from_fn(48, 32, |x, y| {
            image::Rgb([shade, (x * 5) as u8, (y * 7) as u8])
        });
        picture.save(dir.join(name)).unwrap();
    }
    let prompts = dir.join("edits.jsonl");
    std::fs::write(
        &prompts,
        "{\"prompt\": \"make the square red\", \"images\": [\"a.png\"]}\n\
         {\"prompt\": \"turn the sky green at night\", \"extra_info\": {\"image\": \"b.png\"}}\n",
    )
    .unwrap();
    let recipe = |out: &Path, steps: u64, resume: &str| -> Recipe {
        let overrides = [
            format!("model.path={}", model.display()),
            format!("data.train_files=[{}]", prompts.display()),
            format!("trainer.output_dir={}", out.display()),
            format!("trainer.total_steps={steps}"),
            "trainer.save_freq=1".into(),
            format!("trainer.resume={resume}"),
        ];
        Recipe::load(&root().join("examples/flow_grpo_qwen_image_tiny.yaml"), &overrides)
            .expect("recipe")
    };
    // One step (a whole step costs minutes on CPU: diffusers VAE-encodes condition pictures at
    // about 1024², 4056 tokens each here); resuming is the plain pipeline's test above.
    let run = train(&recipe(&dir.join("run"), 1, "none"), Device::Cpu).expect("train");
    let first = &run.metrics[0];
    assert!(first.values().all(|v| v.is_finite()), "{first:?}");
    assert!((first["actor/ratio_mean"] - 1.0).abs() <= 1e-6, "on-policy: {first:?}");
    assert!(first["rollout_corr/logprob_abs_diff_max"] <= 1e-5, "{first:?}");
    assert!(lora_moved(&tensors(&run.export)), "the LoRA trained");
}
