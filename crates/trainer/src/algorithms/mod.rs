//! The algorithm seam: each registered objective is one module here with one struct that owns
//! its state (an old policy, an anchor, teachers, a gate), says what the loop must provide (a
//! reference policy), which copies of the trained weights it keeps and what its checkpoints hold,
//! and runs its own half of a training step on what the loop hands it. The loop knows no
//! algorithm by name: [`for_objective`] is the one registry line per algorithm.

mod dgpo;
mod diversity;
mod dmd2;
mod dpo;
mod gardo;
mod nft;
mod old_policy;
mod policy_gradient;
mod teachers;

use std::collections::BTreeMap;
use std::sync::RwLock;

use flowtune_config::Recipe;
use flowtune_data::PromptLoader;
use flowtune_models::{FlowPipeline, PipelineOptions};
use flowtune_objectives::Objective;
use flowtune_sampling::SigmaGrid;
use tch::Tensor;

use crate::optim::Ema;
use crate::run::Run;
use crate::source::Source;
use crate::stateful::Stateful;
use crate::step::Step;
use crate::update::Learner;
use crate::TrainError;

/// One family of training steps and the state it carries from step to step; what it keeps beside
/// the weights and its copies of them ([`Stateful`]) goes into every checkpoint.
pub trait Algorithm: Stateful {
    /// Loads the models it needs beside the pipeline (teachers), as the pipeline was loaded with
    /// `options`, before the run's folder exists.
    fn load(
        &mut self,
        _recipe: &Recipe,
        _options: &PipelineOptions,
        _pipe: &dyn FlowPipeline,
    ) -> Result<(), TrainError> {
        Ok(())
    }

    /// Makes its copies of the trained parameters `params` (in host memory with `host`), once
    /// they exist and before any step or resume.
    fn start(&mut self, _params: &BTreeMap<String, Tensor>, _host: bool) {}

    /// Its copies of the trained weights (saved under their names, block by block when the
    /// blocks are sharded).
    fn shadows(&self) -> Vec<&Ema> {
        vec![]
    }

    /// The grid the trained model samples on without guidance, when not the pipeline's at
    /// `rollout.eval_steps` with CFG (a few-step student's); validation samples on it.
    fn sampling_grid(&self) -> Option<SigmaGrid> {
        None
    }

    /// Training step `step`: gathers its data from `source` (rollout and rewards, or preference
    /// pairs) and updates `learner`, at the step's learning rate, into the step's metrics and
    /// timers; returns the samples it trained on.
    fn step(
        &mut self,
        run: &Run<'_>,
        learner: &mut Learner,
        source: &mut Source,
        step: &mut Step,
    ) -> Result<usize, TrainError>;
}

/// The algorithm of a registry entry (its trainer step); one line per built-in objective.
pub(crate) fn build(
    entry: &'static flowtune_objectives::Algorithm,
) -> Result<Box<dyn Algorithm>, TrainError> {
    Ok(match entry.objective {
        Objective::Policy(loss) => Box::new(policy_gradient::PolicyGradient::new(Some(loss))),
        Objective::Distill => Box::new(policy_gradient::PolicyGradient::new(None)),
        Objective::Dpo => Box::new(dpo::Dpo),
        Objective::Nft => Box::new(nft::Nft::default()),
        Objective::Dgpo => Box::new(dgpo::Dgpo::default()),
        Objective::Gardo => Box::new(gardo::Gardo::default()),
        Objective::Dmd2 => Box::new(dmd2::Dmd2::default()),
        Objective::Registered => registered(entry.name)?,
    })
}

/// Steps of algorithms registered at run time, by name.
static REGISTERED: RwLock<Vec<(&'static str, Builder)>> = RwLock::new(Vec::new());

/// Makes a fresh algorithm.
pub type Builder = fn() -> Box<dyn Algorithm>;

/// Registers an algorithm: its registry entry (name, needs, summary; `objective:
/// Objective::Registered`) with the recipe loader, and `build` as its trainer step.
pub fn register(entry: &'static flowtune_objectives::Algorithm, build: Builder) {
    flowtune_objectives::register(entry);
    REGISTERED.write().expect("registry lock").push((entry.name, build));
}

fn registered(name: &str) -> Result<Box<dyn Algorithm>, TrainError> {
    let steps = REGISTERED.read().expect("registry lock");
    let build = steps.iter().rev().find(|(n, _)| *n == name).map(|(_, b)| *b);
    build.map(|b| b()).ok_or_else(|| {
        TrainError::Invalid(format!(
            "algorithm: {name} is registered without a trainer step; register it with \
             flowtune_trainer::register_algorithm"
        ))
    })
}

/// The prompt loader of an online step.
pub(crate) fn prompts(source: &mut Source) -> Result<&mut PromptLoader, TrainError> {
    match source {
        Source::Prompts(loader) => Ok(loader),
        Source::Pairs(_) => {
            Err(TrainError::Invalid("data.preference_files trains only algorithm: dpo".into()))
        }
    }
}
