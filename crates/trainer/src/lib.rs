//! The online RL training loop (`flowtune train`): each step is rollout → rewards → the
//! algorithm's update → checkpoint, each under a named timer, with the metric names of the
//! reference framework. It knows model families only through the `flowtune-models` traits, and
//! algorithms (one module each under `algorithms/`) only through [`algorithms::Algorithm`].

mod algorithms;
mod build;
pub mod checkpoint;
mod checkpointer;
mod collect;
pub mod dist;
mod export;
mod fit;
pub mod images;
mod layout;
mod logging;
mod manifest;
pub mod optim;
mod perf;
pub mod pretrain;
mod reference;
mod replay;
mod run;
mod scoring;
mod seeds;
mod signals;
mod source;
mod split;
mod stateful;
mod step;
pub mod tensorboard;
pub mod threads;
mod update;
mod validation;

pub use build::TrainOptions;
pub use fit::{train, train_with, TrainSummary};

/// The algorithm seam, for an algorithm made outside this crate (a test's, a plug-in's): the
/// trait, its registration, and what a step reads and calls (`docs/algorithms/adding.md`).
pub mod algorithm {
    pub use crate::algorithms::{register as register_algorithm, Algorithm, Builder};
    pub use crate::run::Run;
    pub use crate::source::{PairSource, Source};
    pub use crate::stateful::{Scope, Stateful};
    pub use crate::step::{Step, Timers};
    pub use crate::update::{optimize, Batching, Learner, MicroPass, SlotLoss};
}
pub use perf::status_bytes;

use std::path::{Path, PathBuf};

/// Why training stopped.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A setting or an input that cannot work; the message names it and what is expected.
    #[error("{0}")]
    Invalid(String),
    /// A file or folder could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An image could not be read or written.
    #[error("{}: {source}", path.display())]
    Image {
        path: PathBuf,
        #[source]
        source: image::ImageError,
    },
    /// Training went numerically wrong (a non-finite loss); the message says where.
    #[error("{0}")]
    Diverged(String),
    /// A step was left with nothing to train on (every sample lost to reward failures).
    #[error("{0}")]
    NoSamples(String),
    #[error("rollout: {0}")]
    Rollout(#[from] flowtune_rollout::RolloutError),
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
    /// A collective between the ranks of a job failed: a peer died, hung past the timeout, or
    /// could not be reached.
    #[error("distributed: {0}")]
    Distributed(String),
}

impl TrainError {
    /// An I/O failure on `path`.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io { path: path.to_path_buf(), source }
    }

    /// Whether the user has to change an input (recipe, files, model) rather than the run having
    /// failed while it ran (disk, libtorch, a reward server, divergence).
    pub fn is_bad_input(&self) -> bool {
        use flowtune_objectives::ObjectiveError as O;
        use flowtune_rollout::RolloutError as R;
        match self {
            Self::Invalid(_) | Self::Data(_) | Self::Sampling(_) => true,
            Self::Model(e) | Self::Rollout(R::Model(e)) => !e.is_runtime(),
            Self::Rollout(R::Input(_) | R::Sampling(_)) => true,
            Self::Objective(e) => matches!(e, O::Invalid { .. } | O::UnknownAlgorithm { .. }),
            Self::Reward(e) => matches!(e, flowtune_rewards::RewardError::Config(_)),
            Self::Io { .. } | Self::Image { .. } | Self::Diverged(_) | Self::NoSamples(_) => false,
            Self::Torch(_) | Self::Distributed(_) => false,
            Self::Rollout(R::Torch(_)) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowtune_models::ModelError;
    use flowtune_rewards::RewardError;

    #[test]
    fn bad_input_and_runtime_failures_are_told_apart_and_keep_their_source() {
        assert!(TrainError::Invalid("model.resolution 30: …".into()).is_bad_input());
        let missing = ModelError::Missing { path: "t.safetensors".into(), names: "w".into() };
        assert!(TrainError::Model(missing).is_bad_input());
        let torch = ModelError::Torch(tch::TchError::Torch("CUDA out of memory".into()));
        assert!(!TrainError::Model(torch).is_bad_input());
        let lost = ModelError::Collective("all-gather: rank 1 is gone".into());
        assert!(!TrainError::Model(lost).is_bad_input(), "a lost rank is no bad input");
        assert!(!TrainError::Diverged("step 3: the loss is NaN".into()).is_bad_input());
        let down = RewardError::Failed { reward: "http".into(), message: "refused".into() };
        assert!(!TrainError::Reward(down).is_bad_input());
        let io = TrainError::io(Path::new("/runs/x"), std::io::Error::other("disk full"));
        assert!(!io.is_bad_input());
        assert_eq!(io.to_string(), "/runs/x: disk full");
        let source = std::error::Error::source(&io).expect("the io error is kept");
        assert_eq!(source.to_string(), "disk full");
        let rollout: TrainError =
            flowtune_rollout::RolloutError::Input("3 seeds for 4 prompts".into()).into();
        assert!(rollout.is_bad_input() && std::error::Error::source(&rollout).is_some());
    }
}
