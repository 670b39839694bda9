//! Rollouts: denoising trajectories that record what the trainer replays
//! (`../shared/spec/algorithms.md` §3).

pub mod trajectory;

pub use trajectory::{sample_trajectory, Guidance, Trajectory, TrajectoryRequest};

/// Why a rollout failed.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error(transparent)]
    Model(#[from] flowtune_models::ModelError),
    #[error(transparent)]
    Sampling(#[from] flowtune_sampling::SamplingError),
    #[error("{0}")]
    Input(String),
}
