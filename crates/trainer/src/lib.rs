//! The online RL training loop (`flowtune train`): each step is rollout → rewards → old log-probs
//! → reference → advantages → update → checkpoint, each under a named timer, with the metric names
//! of the reference framework.

pub mod checkpoint;
pub mod engine;
mod fit;
pub mod images;
pub mod optim;
pub mod pretrain;
mod scoring;
pub mod tensorboard;
mod update;

pub use fit::{train, TrainSummary};

/// Why training stopped.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Io(String),
    #[error("rollout: {0}")]
    Rollout(String),
    #[error(transparent)]
    Model(#[from] flowtune_models::ModelError),
    #[error(transparent)]
    Sampling(#[from] flowtune_sampling::SamplingError),
    #[error(transparent)]
    Objective(#[from] flowtune_objectives::ObjectiveError),
    #[error(transparent)]
    Reward(#[from] flowtune_rewards::RewardError),
    #[error(transparent)]
    Data(#[from] flowtune_data::DataError),
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}
