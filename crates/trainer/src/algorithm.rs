//! The algorithm seam: each registered objective says what it needs (a reference, an old policy)
//! and runs its own half of a training step on what the loop hands it. `fit` calls
//! [`Algorithm::step`] and knows nothing else about any algorithm.

use flowtune_config::Recipe;
use flowtune_data::PromptLoader;
use flowtune_objectives::losses::PolicyLoss;
use flowtune_objectives::{Metrics, Objective};

use crate::collect::{collect, Collected};
use crate::run::Run;
use crate::source::Source;
use crate::update::Learner;
use crate::TrainError;

/// One family of training steps.
pub(crate) trait Algorithm {
    /// Whether its steps read the reference policy (its own loss, or `actor.use_kl_loss`).
    fn needs_reference(&self, recipe: &Recipe) -> bool;

    /// Whether the learner keeps an old (sampling) policy beside the trained weights.
    fn keeps_old_policy(&self) -> bool {
        false
    }

    /// Training step `k` at learning rate `lr`: gathers its data from `source` (rollout and
    /// rewards, or preference pairs) and updates `learner`; returns the samples it trained on.
    fn step(
        &self,
        run: &Run<'_>,
        learner: &mut Learner,
        source: &mut Source,
        k: u64,
        lr: f64,
        m: &mut Metrics,
    ) -> Result<usize, TrainError>;
}

/// The step of a registered objective.
pub(crate) fn for_objective(objective: Objective) -> Box<dyn Algorithm> {
    match objective {
        Objective::Policy(loss) => Box::new(PolicyGradient(Some(loss))),
        Objective::Distill => Box::new(PolicyGradient(None)),
        Objective::Dpo => Box::new(Dpo),
        Objective::Nft => Box::new(Nft),
        Objective::Dgpo => Box::new(Dgpo),
        Objective::Gardo => Box::new(Gardo::default()),
    }
}

/// The prompt loader of an online step.
fn prompts(source: &mut Source) -> Result<&mut PromptLoader, TrainError> {
    match source {
        Source::Prompts(loader) => Ok(loader),
        Source::Pairs(_) => {
            Err(TrainError::Invalid("data.preference_files trains only algorithm: dpo".into()))
        }
    }
}

/// Flow-GRPO and its family: SDE rollouts, group advantages, a clipped step-ratio loss; with no
/// loss, DiffusionOPD's distillation alone.
struct PolicyGradient(Option<PolicyLoss>);

impl Algorithm for PolicyGradient {
    fn needs_reference(&self, recipe: &Recipe) -> bool {
        recipe.actor.use_kl_loss
    }

    fn step(
        &self,
        run: &Run<'_>,
        learner: &mut Learner,
        source: &mut Source,
        k: u64,
        lr: f64,
        m: &mut Metrics,
    ) -> Result<usize, TrainError> {
        let c = collect(run, prompts(source)?, k, m)?;
        run.status("update");
        crate::policy::policy_step(run, learner, self.0, &c, k, lr, m)?;
        Ok(c.batch.images.len())
    }
}

/// Diffusion-DPO, online on best/worst pairs of each group or offline on a pairs dataset.
struct Dpo;

impl Algorithm for Dpo {
    fn needs_reference(&self, _: &Recipe) -> bool {
        true
    }

    fn step(
        &self,
        run: &Run<'_>,
        learner: &mut Learner,
        source: &mut Source,
        k: u64,
        lr: f64,
        m: &mut Metrics,
    ) -> Result<usize, TrainError> {
        match source {
            Source::Pairs(pairs) => {
                run.status("update");
                crate::preference::offline_step(run, learner, pairs, k, lr, m)?;
                Ok(2 * run.recipe.data.prompts_per_step)
            }
            Source::Prompts(loader) => {
                let c = collect(run, loader, k, m)?;
                run.status("update");
                crate::preference::online_step(run, learner, &c, k, lr, m)?;
                Ok(c.batch.images.len())
            }
        }
    }
}

/// DiffusionNFT: the old policy samples, the forward-process loss trains.
struct Nft;

impl Algorithm for Nft {
    fn needs_reference(&self, _: &Recipe) -> bool {
        true
    }

    fn keeps_old_policy(&self) -> bool {
        true
    }

    fn step(
        &self,
        run: &Run<'_>,
        learner: &mut Learner,
        source: &mut Source,
        k: u64,
        lr: f64,
        m: &mut Metrics,
    ) -> Result<usize, TrainError> {
        let c = collect_with_old_policy(run, learner, source, k, m)?;
        crate::nft::nft_step(run, learner, &c, k, lr, m)?;
        Ok(c.batch.images.len())
    }
}

/// DGPO: the old policy samples with the ODE sampler; whole groups train on their re-noised
/// samples.
struct Dgpo;

impl Algorithm for Dgpo {
    fn needs_reference(&self, _: &Recipe) -> bool {
        true
    }

    fn keeps_old_policy(&self) -> bool {
        true
    }

    fn step(
        &self,
        run: &Run<'_>,
        learner: &mut Learner,
        source: &mut Source,
        k: u64,
        lr: f64,
        m: &mut Metrics,
    ) -> Result<usize, TrainError> {
        let c = collect_with_old_policy(run, learner, source, k, m)?;
        crate::dgpo::dgpo_step(run, learner, &c, k, lr, m)?;
        Ok(c.batch.images.len())
    }
}

/// GARDO: Flow-GRPO's rollout and ratio, diversity-shaped advantages and a gated KL to an anchor
/// copy of the weights (kept as the learner's old policy) that is reset when it falls behind.
#[derive(Default)]
struct Gardo {
    /// The diversity model, loaded at the first step.
    features: std::cell::OnceCell<crate::diversity::DiversityFeatures>,
}

impl Algorithm for Gardo {
    fn needs_reference(&self, _: &Recipe) -> bool {
        false
    }

    fn keeps_old_policy(&self) -> bool {
        true
    }

    fn step(
        &self,
        run: &Run<'_>,
        learner: &mut Learner,
        source: &mut Source,
        k: u64,
        lr: f64,
        m: &mut Metrics,
    ) -> Result<usize, TrainError> {
        let features = match self.features.get() {
            Some(f) => f,
            None => {
                let dir = run.recipe.actor.gardo_features.as_ref().ok_or_else(|| {
                    TrainError::Invalid("actor.gardo_features: gardo needs a CLIP model".into())
                })?;
                let loaded = crate::diversity::DiversityFeatures::load(dir, run.comm.device())?;
                self.features.get_or_init(|| loaded)
            }
        };
        let c = collect(run, prompts(source)?, k, m)?;
        run.status("update");
        crate::gardo::gardo_step(run, learner, features, &c, k, lr, m)?;
        Ok(c.batch.images.len())
    }
}

/// The step's samples drawn by the old policy (its weights swapped in while sampling), for the
/// algorithms that keep one to sample with (DiffusionNFT, DGPO).
fn collect_with_old_policy(
    run: &Run<'_>,
    learner: &mut Learner,
    source: &mut Source,
    k: u64,
    m: &mut Metrics,
) -> Result<Collected, TrainError> {
    let loader = prompts(source)?;
    let old = learner.old.as_mut().expect("the algorithm keeps an old policy");
    let c = old.with_swapped(&learner.optimizer.params, || collect(run, loader, k, m))?;
    run.status("update");
    Ok(c)
}
