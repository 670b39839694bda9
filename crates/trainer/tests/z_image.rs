//! Every algorithm on a tiny random Z-Image pipeline (CPU) through the unchanged trainer: each
//! `examples/*_tiny.yaml` pointed at `make-tiny z-image` with Z-Image's LoRA targets trains, is
//! on-policy before its first update, and resumes to the same adapters and metrics.

mod common;

#[test]
fn every_algorithm_trains_and_resumes_on_z_image() {
    common::families::every_algorithm_trains_and_resumes(
        "z_image",
        "flow_grpo_z_image_tiny.yaml",
        &[],
        "feed_forward.w1.lora_B",
    );
}
