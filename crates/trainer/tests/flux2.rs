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
