//! Reading a shapes-world run back from its `metrics.jsonl`: the validations' accuracies.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{anyhow, Context};
use flowtune_shapes::{entropy_bits, Category, Color};

/// The `data_source` of the demo's held-out prompts (`examples/shapes/heldout.jsonl`).
pub const HELDOUT_SOURCE: &str = "shapes_heldout";

/// One validation of a run on one prompt set (`data_source`).
#[derive(Debug, Clone)]
pub struct Validation {
    pub step: u64,
    /// `val-core/<source>/acc`: the fraction of prompts drawn right.
    pub accuracy: f64,
    /// `val-core/<source>/<category>/acc` by category name.
    pub per_category: BTreeMap<String, f64>,
    /// Entropy in bits of the colours drawn where the prompt names none
    /// (`val-core/<source>/free_color/<colour>`); log2(5) ≈ 2.32 is uniform.
    pub color_entropy: f64,
}

impl Validation {
    /// The validation of prompt set `source` a metrics line holds, if it holds one.
    fn of(m: &serde_json::Value, source: &str) -> Option<Self> {
        let accuracy = m.get(format!("val-core/{source}/acc"))?.as_f64()?;
        let per_category = Category::ALL
            .iter()
            .filter_map(|c| {
                let v = m[format!("val-core/{source}/{}/acc", c.name())].as_f64()?;
                Some((c.name().to_string(), v))
            })
            .collect();
        let shares: Vec<f64> = Color::ALL
            .iter()
            .map(|c| m[format!("val-core/{source}/free_color/{}", c.name())].as_f64())
            .map(|v| v.unwrap_or(0.0))
            .collect();
        let color_entropy = entropy_bits(&shares);
        Some(Validation { step: m["step"].as_u64()?, accuracy, per_category, color_entropy })
    }
}

/// A run's metric lines and its shapes validations, in step order.
pub struct RunLog {
    pub lines: Vec<serde_json::Value>,
    pub validations: Vec<Validation>,
    /// Validations on the held-out prompts ([`HELDOUT_SOURCE`]), where the recipe has them.
    pub heldout: Vec<Validation>,
}

impl RunLog {
    /// Reads `<out>/metrics.jsonl`; a run without shapes validations is an error.
    pub fn read(out: &Path) -> anyhow::Result<Self> {
        let path = out.join("metrics.jsonl");
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&path)
            .with_context(|| path.display().to_string())?
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()
            .with_context(|| path.display().to_string())?;
        let of = |source: &str| -> Vec<Validation> {
            lines.iter().filter_map(|m| Validation::of(m, source)).collect()
        };
        let (validations, heldout) = (of("shapes"), of(HELDOUT_SOURCE));
        if validations.is_empty() {
            return Err(anyhow!("{}: no shapes validation was logged", path.display()));
        }
        Ok(Self { lines, validations, heldout })
    }

    /// The first and the last validation.
    pub fn before_after(&self) -> (&Validation, &Validation) {
        (&self.validations[0], self.validations.last().expect("at least one validation"))
    }

    /// Mean of metric `key` over the training steps that logged it.
    pub fn mean_of(&self, key: &str) -> f64 {
        let v: Vec<f64> = self.lines.iter().filter_map(|m| m.get(key)?.as_f64()).collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    }

    /// (step, value) of metric `key` wherever it was logged.
    pub fn series(&self, key: &str) -> Vec<(f64, f64)> {
        self.lines
            .iter()
            .filter_map(|m| Some((m.get("step")?.as_f64()?, m.get(key)?.as_f64()?)))
            .collect()
    }
}
