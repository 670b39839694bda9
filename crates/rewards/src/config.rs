//! The recipe's `reward` section.

use serde::{Deserialize, Serialize};

/// What happens when a scorer fails or returns a non-finite score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Stop the training step with the error.
    #[default]
    Fail,
    /// Drop the affected samples and count them in `critic/rewards/skipped`.
    SkipSample,
}

/// One weighted scorer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardFunction {
    /// A registered reward name (`flowtune list`).
    pub name: String,
    #[serde(default = "one")]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

/// `reward:` — the weighted scorers and the failure policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RewardConfig {
    pub functions: Vec<RewardFunction>,
    pub on_error: OnError,
}

impl Default for RewardConfig {
    fn default() -> Self {
        Self {
            functions: vec![RewardFunction { name: "jpeg_compressibility".into(), weight: 1.0 }],
            on_error: OnError::Fail,
        }
    }
}
