//! The online RL training loop (`flowtune train`): each step is rollout → rewards → the
//! algorithm's update (policy gradient: old log-probs → reference → advantages → clipped update;
//! Diffusion-DPO on pairs; DiffusionNFT on clean samples) → checkpoint, each under a named timer,
//! with the metric names of the reference framework.

pub mod checkpoint;
mod collect;
pub mod engine;
mod fit;
pub mod images;
mod nft;
pub mod optim;
mod policy;
mod preference;
pub mod pretrain;
mod reference;
mod scoring;
pub mod tensorboard;
mod update;
mod validation;

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
