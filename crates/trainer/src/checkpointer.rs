//! When checkpoints are written and which one a run resumes from: a checkpoint every
//! `trainer.save_freq` steps, at the last step and when a run stops early; `trainer.resume` picks
//! the one to resume (under `auto` the newest whole one), and the checkpoints after it are set
//! aside, never deleted. What a checkpoint holds and how it is written is [`crate::checkpoint`]'s;
//! each part (the optimizer, the copies of the weights, the algorithm) gives its own state.

use std::path::{Path, PathBuf};

use flowtune_config::{Resume, TrainerSection};
use flowtune_models::TrainableDenoiser;

use crate::algorithms::Algorithm;
use crate::checkpoint::{self, LoopState, Parts};
use crate::dist::Comm;
use crate::source::Source;
use crate::stateful::Stateful;
use crate::update::Learner;
use crate::TrainError;

/// The run's checkpoint policy.
pub(crate) struct Checkpointer {
    root: PathBuf,
    every: u64,
    keep: usize,
    /// Off: a measurement leaves no checkpoints.
    write: bool,
}

/// What a checkpoint saves: the trained model, the learner, the algorithm and the data source.
pub(crate) struct Trained<'a> {
    pub model: &'a dyn TrainableDenoiser,
    pub learner: &'a Learner,
    pub algorithm: &'a dyn Algorithm,
    pub source: &'a Source,
}

/// The parts with tensors of their own: the optimizer, the copies of the weights (the learner's
/// EMA and lagged sampling copy, then the algorithm's) and the algorithm.
fn parts<'a>(learner: &'a Learner, algorithm: &'a dyn Algorithm) -> Parts<'a> {
    let mut shadows: Vec<_> = learner.ema.iter().chain(&learner.lagged).collect();
    shadows.extend(algorithm.shadows());
    Parts { optimizer: &learner.optimizer, shadows, others: vec![algorithm as &dyn Stateful] }
}

impl Checkpointer {
    /// `trainer.output_dir/checkpoints`, `trainer.save_freq`, `trainer.keep_last`.
    pub fn new(trainer: &TrainerSection, write: bool) -> Self {
        Self {
            root: trainer.output_dir.join("checkpoints"),
            every: trainer.save_freq,
            keep: trainer.keep_last,
            write,
        }
    }

    /// Restores the model, the learner, the algorithm and the data source from the checkpoint
    /// `resume` names, if any, and returns its loop state.
    pub fn resume(
        &self,
        resume: &Resume,
        model: &mut dyn TrainableDenoiser,
        learner: &mut Learner,
        algorithm: &mut dyn Algorithm,
        source: &mut Source,
        comm: &Comm,
    ) -> Result<Option<LoopState>, TrainError> {
        let Some(dir) = self.resume_from(resume, comm)? else { return Ok(None) };
        let state = checkpoint::load(&dir, model, &parts(learner, algorithm))?;
        learner.optimizer.restore(&state.optimizer_steps)?;
        algorithm.restore(&state.algorithm)?;
        source.restore(&state.loader)?;
        if comm.is_main() {
            eprintln!("resumed from {} (step {})", dir.display(), state.step);
        }
        Ok(Some(state))
    }

    /// Moves the checkpoints after step `start` (the future of another run) aside; rank 0 does.
    pub fn set_aside_after(&self, start: u64, comm: &Comm) -> Result<(), TrainError> {
        if comm.is_main() && self.write {
            checkpoint::set_aside_after(&self.root, start, |m| eprintln!("{m}"))?;
        }
        Ok(())
    }

    /// Writes step `step`'s checkpoint when it is due: every `trainer.save_freq` steps, and at
    /// `last` (the run's last step, or a stop). Every rank calls it.
    pub fn save_if_due(
        &self,
        step: u64,
        last: bool,
        trained: Trained<'_>,
        metrics: serde_json::Value,
        comm: &Comm,
    ) -> Result<(), TrainError> {
        let due = (self.every > 0 && step.is_multiple_of(self.every)) || last;
        if !(due && self.write) {
            return Ok(());
        }
        let state = LoopState {
            step,
            loader: trained.source.state(),
            optimizer_steps: trained.learner.optimizer.state(),
            metrics,
            algorithm: trained.algorithm.state(),
        };
        let parts = parts(trained.learner, trained.algorithm);
        checkpoint::save(&self.root, trained.model, &parts, &state, self.keep, comm)?;
        Ok(())
    }

    /// The checkpoint `resume` names, if any: under `auto` the newest whole one (rank 0 checks
    /// the files and says which it skips; the others take its choice).
    fn resume_from(&self, resume: &Resume, comm: &Comm) -> Result<Option<PathBuf>, TrainError> {
        Ok(match resume {
            Resume::None => None,
            Resume::Auto => {
                let newest = match comm.is_main() {
                    true => checkpoint::newest_whole(&self.root, |m| eprintln!("{m}"))?,
                    false => None,
                };
                // Step + 1 (0: none), summed over the ranks: rank 0's choice.
                let chosen = comm.sum_f64(newest.map_or(0.0, |(step, _)| step as f64 + 1.0))?;
                (chosen > 0.0).then(|| self.root.join(format!("step_{:06}", chosen as u64 - 1)))
            }
            Resume::Path(dir) => Some(checked(dir)?),
        })
    }
}

/// `trainer.resume`'s directory, refused when it is no complete, undamaged checkpoint.
fn checked(dir: &Path) -> Result<PathBuf, TrainError> {
    if !dir.join("state.json").exists() {
        return Err(TrainError::Invalid(format!(
            "trainer.resume: {} is not a complete checkpoint directory (no state.json); use auto, none or a checkpoints/step_NNNNNN directory",
            dir.display()
        )));
    }
    if let Some(why) = crate::manifest::damage(dir) {
        return Err(TrainError::Invalid(format!(
            "trainer.resume: {} is damaged: {why}; trainer.resume: auto takes the newest whole \
             checkpoint",
            dir.display()
        )));
    }
    Ok(dir.to_path_buf())
}
