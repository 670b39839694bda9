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
    use flowtune_models::flux2::{write_tiny_flux2, TinyFlux2Spec};

    let dir = common::scratch("flux2-references");
    let model = dir.join("pipeline");
    // A 4× VAE: the smallest pictures the pipeline takes (64²) are 8 × 8 reference tokens.
    let spec = TinyFlux2Spec { seed: 4, vae_channels: vec![8, 16, 16], ..Default::default() };
    write_tiny_flux2(&model, &spec).expect("make-tiny flux2");
    common::families::picture_rows_train_on_policy_and_resume(
        &dir,
        &model,
        "flow_grpo_flux2_tiny.yaml",
        "references",
    );
}
