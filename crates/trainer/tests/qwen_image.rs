//! Every algorithm on a tiny random Qwen-Image pipeline (CPU) through the unchanged trainer: each
//! `examples/*_tiny.yaml` pointed at `make-tiny qwen-image` with Qwen-Image's LoRA targets trains,
//! is on-policy before its first update (ratio 1, rollout ↔ replay log-prob drift 0), and resumes
//! to the same adapters and metrics.

mod common;

use common::{lora_moved, scratch, tensors};
use flowtune_trainer::train;
use tch::Device;

#[test]
fn every_algorithm_trains_and_resumes_on_qwen_image() {
    common::families::every_algorithm_trains_and_resumes(
        "qwen_image",
        "flow_grpo_qwen_image_tiny.yaml",
        &[],
        "img_mlp.net.0.proj.lora_B",
    );
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
    let prompts = common::families::picture_rows(&dir);
    let recipe = common::families::picture_recipe(
        "flow_grpo_qwen_image_tiny.yaml",
        &model,
        &prompts,
        (&dir.join("run"), 1, "none"),
    );
    // One step (a whole step costs minutes on CPU: diffusers VAE-encodes condition pictures at
    // about 1024², 4056 tokens each here); resuming is the plain pipeline's test above.
    let run = train(&recipe, Device::Cpu).expect("train");
    let first = &run.metrics[0];
    assert!(first.values().all(|v| v.is_finite()), "{first:?}");
    assert!((first["actor/ratio_mean"] - 1.0).abs() <= 1e-6, "on-policy: {first:?}");
    assert!(first["rollout_corr/logprob_abs_diff_max"] <= 1e-5, "{first:?}");
    assert!(lora_moved(&tensors(&run.export)), "the LoRA trained");
}
