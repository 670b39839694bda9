//! Every algorithm on a tiny random Qwen-Image 2.1 pipeline (CPU) through the unchanged trainer:
//! each `examples/*_tiny.yaml` pointed at `make-tiny qwen-image21` with Qwen-Image 2.1's LoRA
//! targets and CFG against the empty prompt trains, is on-policy before its first update, and
//! resumes to the same adapters and metrics.

mod common;

#[test]
fn every_algorithm_trains_and_resumes_on_qwen_image21() {
    common::families::every_algorithm_trains_and_resumes(
        "qwen_image21",
        "flow_grpo_qwen_image21_tiny.yaml",
        &["model.resolution=32", "rollout.guidance_scale=4.0"],
        "img_mlp.gate_layer.lora_B",
    );
}

/// Qwen-Image 2.1 with condition images through the trainer: prompt rows carry pictures
/// (`images`, or `extra_info.image`) that fill the encoder's vision slots and become condition
/// tokens of every row, negatives included; the run is on-policy at its first step, trains and
/// resumes bit for bit.
#[test]
fn condition_images_train_on_policy_and_resume() {
    use std::path::Path;

    use common::{lora_moved, root, scratch, tensors};
    use flowtune_config::Recipe;
    use flowtune_models::qwen_image21::{write_tiny_qwen_image21, TinyQwenImage21Spec};
    use flowtune_trainer::train;
    use tch::Device;

    let dir = scratch("qwen-image21-conditions");
    let model = dir.join("pipeline");
    let spec = TinyQwenImage21Spec { seed: 4, ..Default::default() };
    write_tiny_qwen_image21(&model, &spec).expect("make-tiny qwen-image21");
    for (name, shade) in [("a.png", 40u8), ("b.png", 200)] {
        let picture = image::RgbImage::from_fn(72, 64, |x, y| {
            image::Rgb([shade, (x * 3) as u8, (y * 5) as u8])
        });
        picture.save(dir.join(name)).unwrap();
    }
    let prompts = dir.join("conditions.jsonl");
    std::fs::write(
        &prompts,
        "{\"prompt\": \"the same square, in red\", \"images\": [\"a.png\"]}\n\
         {\"prompt\": \"this scene at night, with a longer caption\", \"extra_info\": {\"image\": \"b.png\"}}\n",
    )
    .unwrap();
    let run = |out: &Path, steps: u64, resume: &str| {
        let overrides = [
            format!("model.path={}", model.display()),
            format!("data.train_files=[{}]", prompts.display()),
            format!("trainer.output_dir={}", out.display()),
            format!("trainer.total_steps={steps}"),
            "trainer.save_freq=1".into(),
            format!("trainer.resume={resume}"),
        ];
        let recipe =
            Recipe::load(&root().join("examples/flow_grpo_qwen_image21_tiny.yaml"), &overrides)
                .expect("recipe");
        train(&recipe, Device::Cpu).expect("train")
    };
    let summary = run(&dir.join("run"), 2, "none");
    let first = &summary.metrics[0];
    assert!(first.values().all(|v| v.is_finite()), "{first:?}");
    assert!((first["actor/ratio_mean"] - 1.0).abs() <= 1e-6, "on-policy: {first:?}");
    assert!(first["rollout_corr/logprob_abs_diff_max"] <= 1e-5, "{first:?}");
    let lora = tensors(&summary.export);
    assert!(lora_moved(&lora), "the LoRA trained");
    let resumed = dir.join("resumed");
    run(&resumed, 1, "none");
    let again = run(&resumed, 2, "auto");
    assert_eq!(again.steps_run, 1, "resumed from step 1");
    let after = tensors(&again.export);
    for (key, t) in &lora {
        assert!(t.equal(&after[key]), "{key} differs after resuming");
    }
    common::assert_same_metrics("conditions: ", &summary.metrics[1], &again.metrics[0]);
}
