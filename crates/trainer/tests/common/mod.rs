//! Helpers of the trainer's end-to-end tests: scratch folders (removed when dropped), one tiny
//! SD3 pipeline per test binary (written by the registered family's tiny writer), and recipes
//! pointed at both.

#![allow(dead_code)]

pub mod families;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use flowtune_config::Recipe;
use tch::Tensor;

pub use flowtune_fixtures::scratch;

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One tiny pipeline for every test of a binary.
pub fn pipeline() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = flowtune_fixtures::shared!("train-pipeline");
        let family = flowtune_models::family_named("sd3").expect("sd3 is built in");
        (family.write_tiny)(&d, 3).expect("make-tiny");
        d
    })
}

/// `examples/<file>` on the tiny pipeline and prompts, writing to `out`, plus `overrides`.
pub fn load_recipe(file: &str, out: &Path, overrides: &[String]) -> Result<Recipe, String> {
    let mut all = vec![
        format!("model.path={}", pipeline().display()),
        format!("data.train_files=[{}]", root().join("examples/prompts/tiny.txt").display()),
        format!("trainer.output_dir={}", out.display()),
    ];
    all.extend(overrides.iter().cloned());
    Recipe::load(&root().join("examples").join(file), &all).map_err(|e| e.to_string())
}

/// The Flow-GRPO tiny recipe.
pub fn recipe(out: &Path, overrides: &[String]) -> Recipe {
    load_recipe("flow_grpo_tiny.yaml", out, overrides).expect("recipe")
}

pub fn tensors(path: &Path) -> BTreeMap<String, Tensor> {
    Tensor::read_safetensors(path).expect("safetensors").into_iter().collect()
}

pub fn metric_lines(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Whether some `lora_B` tensor of `lora` is non-zero (adapters start at B = 0).
pub fn lora_moved(lora: &BTreeMap<String, Tensor>) -> bool {
    lora.iter()
        .filter(|(k, _)| k.contains("lora_B"))
        .any(|(_, t)| t.abs().max().double_value(&[]) > 0.0)
}

/// Asserts that a resumed run's metrics equal the straight run's at the same step (timings and
/// performance figures aside; NaN equals NaN). `what` prefixes the message.
pub fn assert_same_metrics(
    what: &str,
    straight: &flowtune_objectives::Metrics,
    resumed: &flowtune_objectives::Metrics,
) {
    for (key, a) in straight {
        if key.starts_with("perf/") || key.starts_with("timing") {
            continue;
        }
        let b = resumed[key];
        assert!(a == &b || (a.is_nan() && b.is_nan()), "{what}{key}: {a} vs {b} resumed");
    }
}

/// GARDO's tiny recipe with its CLIP paths made absolute (tests run outside the repository root):
/// the trained reward `trained` and the weight-0 `aesthetic` proxy on the tiny CLIP model.
pub fn gardo_overrides(trained: &str) -> Vec<String> {
    let clip = root().join("crates/rewards/tests/fixtures/clip");
    let (model, head) = (clip.join("clip_tiny"), clip.join("aesthetic_head.safetensors"));
    vec![
        format!("actor.gardo_features={}", model.display()),
        format!(
            "reward.functions=[{{name: {trained}}}, {{name: aesthetic, weight: 0, clip: {{model: {}, head: {}, device: cpu}}}}]",
            model.display(),
            head.display()
        ),
    ]
}

/// A second tiny SD3 pipeline with other random weights: DiffusionOPD's teacher.
pub fn teacher_pipeline() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = flowtune_fixtures::shared!("train-teacher");
        let family = flowtune_models::family_named("sd3").expect("sd3 is built in");
        (family.write_tiny)(&d, 7).expect("make-tiny");
        d
    })
}
