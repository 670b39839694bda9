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
    use flowtune_models::qwen_image21::{write_tiny_qwen_image21, TinyQwenImage21Spec};

    let dir = common::scratch("qwen-image21-conditions");
    let model = dir.join("pipeline");
    let spec = TinyQwenImage21Spec { seed: 4, ..Default::default() };
    write_tiny_qwen_image21(&model, &spec).expect("make-tiny qwen-image21");
    common::families::picture_rows_train_on_policy_and_resume(
        &dir,
        &model,
        "flow_grpo_qwen_image21_tiny.yaml",
        "conditions",
    );
}
