//! Every algorithm on a tiny random FLUX.2 [klein] pipeline (CPU) through the unchanged trainer:
//! each `examples/*_tiny.yaml` pointed at `make-tiny flux2` with FLUX.2's LoRA targets and CFG
//! against the empty prompt trains, is on-policy before its first update, and resumes to the same
//! adapters and metrics.

mod common;

#[test]
fn every_algorithm_trains_and_resumes_on_flux2() {
    common::families::every_algorithm_trains_and_resumes(
        "flux2",
        "flow_grpo_flux2_tiny.yaml",
        &["model.max_sequence_length=16", "rollout.guidance_scale=4.0"],
        "attn.to_qkv_mlp_proj.lora_B",
    );
}

/// FLUX.2 [dev] (Mistral3 text encoder, distilled guidance through its embedding, no CFG): the
/// tiny recipes (`flow_grpo_flux2_dev_tiny.yaml` and the others with its guidance 3) train, are
/// on-policy at step 1 and resume bit for bit.
#[test]
fn every_algorithm_trains_and_resumes_on_flux2_dev() {
    use flowtune_models::flux2::{write_tiny_flux2, TinyFlux2Spec};
    common::families::every_algorithm_trains_and_resumes_on(
        "flux2-dev",
        |dir, seed| write_tiny_flux2(dir, &TinyFlux2Spec { seed, dev: true, ..Default::default() }),
        "flow_grpo_flux2_dev_tiny.yaml",
        &["model.max_sequence_length=16", "model.guidance=3.0", "rollout.guidance_scale=1.0"],
        "attn.to_qkv_mlp_proj.lora_B",
    );
}

/// FLUX.2 [klein] with reference images through the trainer: prompt rows carry pictures
/// (`images`, or `extra_info.image`) that become reference tokens of every row, negatives
/// included; the run is on-policy at its first step, trains and resumes bit for bit.
#[test]
fn reference_images_train_on_policy_and_resume() {
    use std::path::Path;

    use common::{lora_moved, root, scratch, tensors};
    use flowtune_config::Recipe;
    use flowtune_models::flux2::{write_tiny_flux2, TinyFlux2Spec};
    use flowtune_trainer::train;
    use tch::Device;

    let dir = scratch("flux2-references");
    let model = dir.join("pipeline");
    // A 4× VAE: the smallest pictures the pipeline takes (64²) are 8 × 8 reference tokens.
    let spec = TinyFlux2Spec { seed: 4, vae_channels: vec![8, 16, 16], ..Default::default() };
    write_tiny_flux2(&model, &spec).expect("make-tiny flux2");
    for (name, shade) in [("a.png", 40u8), ("b.png", 200)] {
        let picture = image::RgbImage::from_fn(72, 64, |x, y| {
            image::Rgb([shade, (x * 3) as u8, (y * 5) as u8])
        });
        picture.save(dir.join(name)).unwrap();
    }
    let prompts = dir.join("references.jsonl");
    std::fs::write(
        &prompts,
        "{\"prompt\": \"the same square, in red\", \"images\": [\"a.png\"]}\n\
         {\"prompt\": \"this scene at night\", \"extra_info\": {\"image\": \"b.png\"}}\n",
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
        let recipe = Recipe::load(&root().join("examples/flow_grpo_flux2_tiny.yaml"), &overrides)
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
    common::assert_same_metrics("references: ", &summary.metrics[1], &again.metrics[0]);
}
