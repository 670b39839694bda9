//! What RL post-training optimises: group advantages ([`advantages`]; GARDO's in [`gardo`]), the losses of every
//! algorithm ([`losses`]), rollout correction ([`correction`]) and the registry that maps a recipe's `algorithm:` to them
//! ([`registry`]). Pure functions of tensors; the trainer supplies the forwards.

pub mod advantages;
pub mod correction;
pub mod gardo;
pub mod losses;
pub mod registry;

pub use advantages::{group_advantages, AdvantageConfig, Advantages};
pub use correction::{Correction, CorrectionConfig, Level};
pub use losses::{LossConfig, LossOutput, Metrics};
pub use registry::{
    algorithm, algorithms, register, Algorithm, Distills, Needs, Objective, ReferenceNeed,
    RolloutNeed, Sampling, ALGORITHMS,
};

/// Errors of the objectives: bad settings, mismatched shapes, missing inputs, non-finite values.
#[derive(Debug, thiserror::Error)]
pub enum ObjectiveError {
    #[error("{key}: {value} is not allowed; expected {expected}")]
    Invalid { key: &'static str, value: String, expected: &'static str },
    #[error("unknown algorithm `{name}`; known: {known}")]
    UnknownAlgorithm { name: String, known: String },
    #[error("shape mismatch: {0}")]
    Shape(String),
    #[error("{0}")]
    Missing(String),
    #[error("non-finite value: {0}")]
    NonFinite(String),
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

impl ObjectiveError {
    pub(crate) fn invalid(
        key: &'static str,
        value: impl std::fmt::Display,
        expected: &'static str,
    ) -> Self {
        Self::Invalid { key, value: value.to_string(), expected }
    }
}
