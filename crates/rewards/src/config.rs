//! The recipe's `reward` section.

use serde::{Deserialize, Serialize};

/// What happens when a scorer fails or returns a non-finite score.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Stop the training step with the error.
    #[default]
    Fail,
    /// Drop the affected samples and count them in `critic/rewards/skipped`.
    SkipSample,
}

/// One weighted scorer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewardFunction {
    /// A registered reward name (`flowtune list`).
    pub name: String,
    /// Its score's factor in the reward; 0 scores and logs it without training on it.
    #[serde(default = "one")]
    pub weight: f64,
    /// `http`: the scorer's endpoint (`http(s)://host:port/path`); `vlm_judge`: the
    /// chat-completions endpoint (`http(s)://host:port/v1/chat/completions`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// `http`, `vlm_judge`: the settings of the client (`vlm_judge` sends one image per request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<crate::HttpSettings>,
    /// `shapes_geneval`: score the fraction of checks passed instead of 1 / 0.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schemars(extend("default" = false))]
    pub partial: bool,
    /// `vlm_judge`: the model, prompts, sampling and scoring mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlm: Option<crate::VlmSettings>,
    /// `ocr`: where the models and ONNX Runtime are, threads, confidence cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ocr: Option<crate::OcrSettings>,
    /// `clip_score`, `pickscore`, `aesthetic`: the CLIP weights (and head) and their device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip: Option<crate::ClipSettings>,
    /// `hpsv3`: the preference model's folder, prompt, picture size and device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hpsv3: Option<crate::Hpsv3Settings>,
    /// `loudness`: the target level and how fast the score falls away from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loudness: Option<crate::LoudnessSettings>,
    /// Video samples: score every this-many-th frame (0, k, 2k, …) and take the mean.
    #[serde(default = "one_frame", skip_serializing_if = "is_one_frame")]
    #[schemars(extend("default" = 1))]
    pub frame_interval: usize,
}

fn one_frame() -> usize {
    1
}

fn is_one_frame(k: &usize) -> bool {
    *k == 1
}

impl RewardFunction {
    /// The reward `name` with weight 1 and default settings.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            weight: 1.0,
            url: None,
            http: None,
            partial: false,
            vlm: None,
            ocr: None,
            clip: None,
            hpsv3: None,
            loudness: None,
            frame_interval: 1,
        }
    }
}

fn one() -> f64 {
    1.0
}

/// `reward:` — the weighted scorers and the failure policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RewardConfig {
    /// The scorers; a sample's reward is the weighted sum of their scores.
    pub functions: Vec<RewardFunction>,
    pub on_error: OnError,
    /// Score each chunk of `rollout.batch_size` images on a host thread while the model samples
    /// the next chunk; false scores a rank's images after its whole rollout (a reward model on
    /// the sampling GPU then never runs beside the sampler). The scores are the same either way.
    pub overlap: bool,
}

impl Default for RewardConfig {
    fn default() -> Self {
        Self {
            functions: vec![RewardFunction::named("jpeg_compressibility")],
            on_error: OnError::Fail,
            overlap: true,
        }
    }
}
