//! Every algorithm on a tiny random FLUX.1 [dev] pipeline (CPU) through the unchanged trainer:
//! each `examples/*_tiny.yaml` pointed at `make-tiny flux` with FLUX.1's LoRA targets and no CFG
//! (the distilled guidance goes through the guidance embedding) trains, is on-policy before its
//! first update (ratio 1, rollout ↔ replay log-prob drift 0), and resumes to the same adapters
//! and metrics.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::{lora_moved, root, scratch, tensors};
use flowtune_config::Recipe;
use flowtune_trainer::train;
use tch::Device;

/// One tiny FLUX.1 [dev] pipeline for every test of this binary.
fn pipeline() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch("flux-pipeline");
        let family = flowtune_models::family_named("flux").expect("flux is built in");
        (family.write_tiny)(&dir, 5).expect("make-tiny flux");
        dir
    })
}

/// `examples/<file>` on the tiny FLUX.1 pipeline with the FLUX.1 tiny recipe's model settings.
fn recipe(file: &str, out: &Path, steps: u64, resume: &str) -> Recipe {
    let flux = Recipe::load(&root().join("examples/flow_grpo_flux_tiny.yaml"), &[])
        .expect("the FLUX.1 tiny recipe");
    let targets = flux.model.lora.target_modules.join(", ");
    let overrides = [
        format!("model.path={}", pipeline().display()),
        format!("model.lora.target_modules=[{targets}]"),
        "model.guidance=2.0".into(),
        "model.max_sequence_length=16".into(),
        "rollout.guidance_scale=1.0".into(),
        format!("data.train_files=[{}]", root().join("examples/prompts/tiny.txt").display()),
        format!("trainer.output_dir={}", out.display()),
        format!("trainer.total_steps={steps}"),
        "trainer.save_freq=1".into(),
        format!("trainer.resume={resume}"),
    ];
    Recipe::load(&root().join("examples").join(file), &overrides).expect("recipe")
}

#[test]
fn every_algorithm_trains_and_resumes_on_flux() {
    for file in [
        "flow_grpo_flux_tiny.yaml",
        "mix_grpo_tiny.yaml",
        "grpo_guard_tiny.yaml",
        "dance_grpo_tiny.yaml",
        "flow_dppo_tiny.yaml",
        "dpo_tiny.yaml",
        "diffusion_nft_tiny.yaml",
    ] {
        let name = file.trim_end_matches(".yaml");
        let straight = scratch(&format!("flux-{name}"));
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
            lora.keys().any(|k| k.contains("single_transformer_blocks.0.proj_mlp.lora_B")),
            "{file}: the single blocks are adapted: {:?}",
            lora.keys()
        );
        let resumed = scratch(&format!("flux-{name}-resumed"));
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
