//! Every algorithm on a tiny random FLUX.1 [dev] pipeline (CPU) through the unchanged trainer:
//! each `examples/*_tiny.yaml` pointed at `make-tiny flux` with FLUX.1's LoRA targets and no CFG
//! (the distilled guidance goes through the guidance embedding) trains, is on-policy before its
//! first update, and resumes to the same adapters and metrics.

mod common;

#[test]
fn every_algorithm_trains_and_resumes_on_flux() {
    common::families::every_algorithm_trains_and_resumes(
        "flux",
        "flow_grpo_flux_tiny.yaml",
        &["model.guidance=2.0", "model.max_sequence_length=16", "rollout.guidance_scale=1.0"],
        "single_transformer_blocks.0.proj_mlp.lora_B",
    );
}
