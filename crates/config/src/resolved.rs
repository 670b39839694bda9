//! The recipe a run was started with, kept in its folder (`recipe.resolved.yaml`), and what a
//! resume may change of it: where and how often it saves, logs and validates, how it lays the work
//! over devices and memory, and how long it runs; any other key changes what it computes.

use crate::Recipe;

/// The run folder's copy of the resolved recipe.
pub const RESOLVED: &str = "recipe.resolved.yaml";

/// Keys (or sections, by prefix) a resumed run may change freely.
const FREE: &[&str] = &[
    "trainer.total_steps",
    "trainer.output_dir",
    "trainer.save_freq",
    "trainer.keep_last",
    "trainer.resume",
    "trainer.image_freq",
    "trainer.val_freq",
    "trainer.val_before_train",
    "trainer.time_limit_s",
    "trainer.dist_timeout_s",
    "trainer.device",
    "trainer.peak_tflops",
    "trainer.gradient_checkpointing",
    "trainer.sharding",
    "trainer.offload",
    "trainer.sequence_parallel_size",
    "trainer.rollout_ranks",
    "trainer.allow_recipe_change",
    "trainer.memory_check",
    "trainer.auto_memory_gib",
    "trainer.exact_gradient_sum",
    "rollout.batch_size",
    "model.offload",
    "data.val_files",
];

/// Every leaf of `value` by dotted key (lists whole).
fn leaves(prefix: &str, value: &serde_json::Value, out: &mut Vec<(String, serde_json::Value)>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                leaves(&key, v, out);
            }
        }
        other => out.push((prefix.to_string(), other.clone())),
    }
}

impl Recipe {
    /// The keys whose values differ from `earlier`'s and change what the run computes, as
    /// `key: earlier → now`.
    pub fn math_changes(&self, earlier: &Recipe) -> Vec<String> {
        let flat = |r: &Recipe| {
            let mut out = vec![];
            leaves("", &serde_json::to_value(r).expect("a recipe is JSON"), &mut out);
            out
        };
        let before: std::collections::BTreeMap<_, _> = flat(earlier).into_iter().collect();
        flat(self)
            .into_iter()
            .filter(|(key, _)| !FREE.iter().any(|f| key == f || key.starts_with(&format!("{f}."))))
            .filter_map(|(key, now)| {
                let then = before.get(&key).cloned().unwrap_or(serde_json::Value::Null);
                (then != now).then(|| format!("{key}: {then} → {now}"))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_keys_that_change_the_math_are_named() {
        let earlier = Recipe::default();
        let mut now = earlier.clone();
        now.trainer.total_steps += 10;
        now.trainer.save_freq = 1;
        now.trainer.sharding = Some(crate::Sharding::Frozen);
        assert!(now.math_changes(&earlier).is_empty());
        now.trainer.lr *= 2.0;
        now.seed = 7;
        let changes = now.math_changes(&earlier);
        assert_eq!(changes.len(), 2, "{changes:?}");
        assert!(changes.contains(&"seed: 42 → 7".to_string()), "{changes:?}");
        assert!(changes.iter().any(|c| c.starts_with("trainer.lr: ")), "{changes:?}");
        assert_eq!(Recipe::from_yaml(&now.to_yaml(), "r.yaml", &[]).unwrap(), now);
    }
}
