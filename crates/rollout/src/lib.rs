//! Rollouts: denoising trajectories that record what the trainer replays
//! (`docs/spec/algorithms.md` §3), and the engine that runs them on any registered pipeline.

pub mod engine;
pub mod prompt_cache;
pub mod rows;
pub mod trajectory;

pub use engine::{encode_rows, Engine, RolloutBatch};
pub use prompt_cache::PromptCache;
pub use rows::Rows;
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
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}
