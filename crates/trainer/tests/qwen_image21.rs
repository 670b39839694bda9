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
