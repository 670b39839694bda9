//! The old policy of the algorithms that sample with one (DiffusionNFT, DGPO): a copy of the
//! trained weights, made when training starts and saved as the `old` shadow, that samples each
//! step's data and then follows the trained weights.

use std::collections::BTreeMap;

use flowtune_objectives::LossConfig;
use tch::Tensor;

use crate::collect::{collect, Collected};
use crate::optim::Ema;
use crate::run::Run;
use crate::source::Source;
use crate::step::Step;
use crate::update::Learner;
use crate::TrainError;

/// An algorithm's old policy (none before [`Self::start`]).
#[derive(Default)]
pub(crate) struct OldPolicy(Option<Ema>);

impl OldPolicy {
    /// Makes the copy of `params` (in host memory with `host`).
    pub fn start(&mut self, params: &BTreeMap<String, Tensor>, host: bool) {
        self.0 = Some(Ema::new("old", 0.0, params, host));
    }

    /// The copy, as checkpoints save it.
    pub fn shadows(&self) -> Vec<&Ema> {
        self.0.iter().collect()
    }

    /// The step's samples drawn with the old weights swapped in, and the copy; `algorithm` names
    /// the algorithm when it was never started.
    pub fn collect(
        &mut self,
        algorithm: &str,
        run: &Run<'_>,
        learner: &Learner,
        source: &mut Source,
        step: &mut Step,
    ) -> Result<(Collected, &mut Ema), TrainError> {
        let old = self.0.as_mut().ok_or_else(|| {
            TrainError::Invalid(format!("{algorithm}: its old policy is made when training starts"))
        })?;
        let loader = super::prompts(source)?;
        let collected =
            old.with_swapped(&learner.optimizer.params, || collect(run, loader, step))?;
        run.status("update");
        Ok((collected, old))
    }
}

/// Moves `old` towards the trained `params` every `actor.old_policy_update_interval` steps, by
/// the step's `actor.old_policy_decay`, logging the decay.
pub(crate) fn follow(
    old: &mut Ema,
    actor: &LossConfig,
    params: &BTreeMap<String, Tensor>,
    step: &mut Step,
) {
    if step.number.is_multiple_of(actor.old_policy_update_interval) {
        old.decay = actor.old_policy_decay.decay(step.number);
        old.update(params);
        step.metrics.insert("actor/old_policy_decay".into(), old.decay);
    }
}
