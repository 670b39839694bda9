//! The end-to-end check every model family passes: each algorithm's tiny recipe, pointed at the
//! family's tiny pipeline and its tiny recipe's LoRA targets, trains, is on-policy before its first
//! update (ratio 1, rollout ↔ replay log-prob drift 0), and resumes to the same adapters and
//! metrics.

use std::path::Path;

use flowtune_config::Recipe;
use flowtune_trainer::train;
use tch::Device;

use super::{lora_moved, root, scratch, tensors};

/// The algorithms' tiny recipes run after the family's own (Flow-GRPO) tiny recipe.
const OTHER_TINY_RECIPES: [&str; 10] = [
    "mix_grpo_tiny.yaml",
    "grpo_guard_tiny.yaml",
    "dance_grpo_tiny.yaml",
    "flow_dppo_tiny.yaml",
    "dpo_tiny.yaml",
    "diffusion_nft_tiny.yaml",
    "gardo_tiny.yaml",
    "dgpo_tiny.yaml",
    "diffusion_opd_tiny.yaml",
    "dmd2_tiny.yaml",
];

/// `examples/<file>` on `pipeline` with the LoRA targets of `examples/<family_recipe>` and the
/// family's `extra` overrides.
#[allow(clippy::too_many_arguments)]
fn recipe(
    file: &str,
    family_recipe: &str,
    extra: &[&str],
    pipeline: &Path,
    teacher: &Path,
    out: &Path,
    steps: u64,
    resume: &str,
) -> Recipe {
    let family = Recipe::load(&root().join("examples").join(family_recipe), &[])
        .expect("the family's tiny recipe");
    let targets = family.model.lora.target_modules.join(", ");
    let mut overrides = vec![
        format!("model.path={}", pipeline.display()),
        format!("model.lora.target_modules=[{targets}]"),
        format!("data.train_files=[{}]", root().join("examples/prompts/tiny.txt").display()),
        format!("trainer.output_dir={}", out.display()),
        format!("trainer.total_steps={steps}"),
        "trainer.save_freq=1".into(),
        format!("trainer.resume={resume}"),
    ];
    if file.starts_with("gardo") {
        overrides.extend(super::gardo_overrides("jpeg_incompressibility"));
    }
    if file.starts_with("diffusion_opd") {
        overrides.push(format!("model.teacher_path={}", teacher.display()));
    }
    overrides.extend(extra.iter().map(|o| o.to_string()));
    Recipe::load(&root().join("examples").join(file), &overrides).expect("recipe")
}

/// Runs the check for `family` (its registered tiny writer, seed 5), whose tiny Flow-GRPO recipe
/// is `family_recipe`, with `extra` overrides on every recipe (e.g. no CFG for a
/// guidance-distilled model); every exported LoRA must adapt a layer whose name contains `adapted`.
pub fn every_algorithm_trains_and_resumes(
    family: &str,
    family_recipe: &str,
    extra: &[&str],
    adapted: &str,
) {
    let writer = flowtune_models::family_named(family).expect("a built-in family");
    let label = family_recipe.trim_end_matches(".yaml");
    every_algorithm_trains_and_resumes_on(label, writer.write_tiny, family_recipe, extra, adapted);
}

/// [`every_algorithm_trains_and_resumes`] on the tiny pipelines `write` makes (a family's
/// variant), its scratch folders named after `label`.
pub fn every_algorithm_trains_and_resumes_on(
    label: &str,
    write: fn(&Path, u64) -> Result<(), flowtune_models::ModelError>,
    family_recipe: &str,
    extra: &[&str],
    adapted: &str,
) {
    let pipeline = scratch(&format!("{label}-pipeline"));
    write(&pipeline, 5).expect("make-tiny");
    // DiffusionOPD's teacher: the same family with other random weights.
    let teacher = scratch(&format!("{label}-teacher"));
    write(&teacher, 6).expect("make-tiny");
    for file in std::iter::once(family_recipe).chain(OTHER_TINY_RECIPES) {
        let run = |out: &Path, steps: u64, resume: &str| {
            let r = recipe(file, family_recipe, extra, &pipeline, &teacher, out, steps, resume);
            train(&r, Device::Cpu).unwrap_or_else(|e| panic!("{file}: {e}"))
        };
        let name = file.trim_end_matches(".yaml");
        let out = scratch(&format!("{label}-{name}"));
        let summary = run(&out, 2, "none");
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
            lora.keys().any(|k| k.contains(adapted)),
            "{file}: {adapted} is adapted: {:?}",
            lora.keys()
        );

        let resumed = scratch(&format!("{label}-{name}-resumed"));
        run(&resumed, 1, "none");
        let again = run(&resumed, 2, "auto");
        assert_eq!(again.steps_run, 1, "{file}: resumed from step 1");
        let after = tensors(&again.export);
        for (key, t) in &lora {
            assert!(t.equal(&after[key]), "{file}: {key} differs after resuming");
        }
        super::assert_same_metrics(&format!("{file}: "), &summary.metrics[1], &again.metrics[0]);
    }
}

/// Two 72 × 64 pictures in `dir` and the prompt rows that carry them (one as `images`, one as
/// `extra_info.image`); returns the prompt file.
pub fn picture_rows(dir: &Path) -> std::path::PathBuf {
    for (name, shade) in [("a.png", 40u8), ("b.png", 200)] {
        let picture = image::RgbImage::from_fn(72, 64, |x, y| {
            image::Rgb([shade, (x * 3) as u8, (y * 5) as u8])
        });
        picture.save(dir.join(name)).unwrap();
    }
    let prompts = dir.join("pictures.jsonl");
    std::fs::write(
        &prompts,
        "{\"prompt\": \"the same square, in red\", \"images\": [\"a.png\"]}\n\
         {\"prompt\": \"this scene at night, with a longer caption\", \"extra_info\": {\"image\": \"b.png\"}}\n",
    )
    .unwrap();
    prompts
}

/// `examples/<family_recipe>` on `model` training on `prompts` for `steps` into `out`, saving
/// every step, with `trainer.resume=<resume>`.
pub fn picture_recipe(
    family_recipe: &str,
    model: &Path,
    prompts: &Path,
    (out, steps, resume): (&Path, u64, &str),
) -> Recipe {
    let overrides = [
        format!("model.path={}", model.display()),
        format!("data.train_files=[{}]", prompts.display()),
        format!("trainer.output_dir={}", out.display()),
        format!("trainer.total_steps={steps}"),
        "trainer.save_freq=1".into(),
        format!("trainer.resume={resume}"),
    ];
    Recipe::load(&root().join("examples").join(family_recipe), &overrides).expect("recipe")
}

/// `examples/<family_recipe>` on the tiny pipeline at `model` with the [`picture_rows`] of `dir`:
/// the run is on-policy at its first step, trains, and resumes bit for bit (`label` names it).
pub fn picture_rows_train_on_policy_and_resume(
    dir: &Path,
    model: &Path,
    family_recipe: &str,
    label: &str,
) {
    let prompts = picture_rows(dir);
    let run = |out: &Path, steps: u64, resume: &str| {
        let recipe = picture_recipe(family_recipe, model, &prompts, (out, steps, resume));
        train(&recipe, Device::Cpu).expect("train")
    };
    let summary = run(&dir.join("run"), 2, "none");
    let first = &summary.metrics[0];
    assert!(first.values().all(|v| v.is_finite()), "{label}: {first:?}");
    assert!((first["actor/ratio_mean"] - 1.0).abs() <= 1e-6, "{label}: on-policy: {first:?}");
    assert!(first["rollout_corr/logprob_abs_diff_max"] <= 1e-5, "{label}: {first:?}");
    let lora = tensors(&summary.export);
    assert!(lora_moved(&lora), "{label}: the LoRA trained");
    let resumed = dir.join("resumed");
    run(&resumed, 1, "none");
    let again = run(&resumed, 2, "auto");
    assert_eq!(again.steps_run, 1, "{label}: resumed from step 1");
    let after = tensors(&again.export);
    for (key, t) in &lora {
        assert!(t.equal(&after[key]), "{label}: {key} differs after resuming");
    }
    super::assert_same_metrics(&format!("{label}: "), &summary.metrics[1], &again.metrics[0]);
}
