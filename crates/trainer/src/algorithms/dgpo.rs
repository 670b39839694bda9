//! A DGPO step: the rollout (sampled by the old adapter with the ODE sampler)
//! gives clean final latents and group advantages; timesteps are drawn once per step for the
//! whole batch, each group is re-noised with one noise per timestep, and whole groups are trained
//! together (a micro-batch never splits a group); then the old adapter follows the trained one.

use std::collections::{BTreeMap, HashMap};

use flowtune_objectives::losses::{dgpo_loss, DgpoBatch, DgpoSettings};
use flowtune_sampling::{per_row, row_seed, upload, SampleRng};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tch::Tensor;

use super::nft::predictions;
use super::old_policy::OldPolicy;
use super::Algorithm;
use crate::collect::Collected;
use crate::optim::Ema;
use crate::run::Run;
use crate::seeds::DGPO_SALT;
use crate::source::Source;
use crate::stateful::Stateful;
use crate::step::Step;
use crate::update::{optimize, Batching, Learner, SlotLoss};
use crate::TrainError;

/// DGPO: the old policy samples with the ODE sampler; whole groups train on their re-noised
/// samples.
#[derive(Default)]
pub(crate) struct Dgpo {
    /// The old policy: a copy of the trained weights that samples and follows them.
    old: OldPolicy,
}

/// Its old policy is a shadow; nothing else carries over.
impl Stateful for Dgpo {}

impl Algorithm for Dgpo {
    fn start(&mut self, params: &BTreeMap<String, Tensor>, host: bool) {
        self.old.start(params, host);
    }

    fn shadows(&self) -> Vec<&Ema> {
        self.old.shadows()
    }

    fn step(
        &mut self,
        run: &Run<'_>,
        learner: &mut Learner,
        source: &mut Source,
        step: &mut Step,
    ) -> Result<usize, TrainError> {
        let (collected, old) = self.old.collect("dgpo", run, learner, source, step)?;
        dgpo_step(run, learner, old, &collected, step)?;
        Ok(collected.batch.images.len())
    }
}

/// The rollout-schedule indices every sample trains at this step: `count` of `range`, drawn
/// without replacement from the run's seed and the step.
pub(crate) fn shared_timesteps(
    range: [usize; 2],
    count: usize,
    seed: u64,
    step: u64,
) -> Vec<usize> {
    let mut all: Vec<usize> = (range[0]..range[1]).collect();
    all.shuffle(&mut ChaCha8Rng::seed_from_u64(row_seed(seed ^ DGPO_SALT, step, u64::MAX >> 2)));
    all.truncate(count.clamp(1, range[1] - range[0]));
    all
}

/// The step-wide rows of each prompt group, groups numbered by first appearance.
fn groups_of(uids: &[String]) -> Vec<Vec<usize>> {
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut groups: Vec<Vec<usize>> = vec![];
    for (row, uid) in uids.iter().enumerate() {
        let group = *index.entry(uid).or_insert_with(|| {
            groups.push(vec![]);
            groups.len() - 1
        });
        groups[group].push(row);
    }
    groups
}

/// Advantages, the DGPO update and the old-adapter refresh of training step `step`.
fn dgpo_step(
    run: &Run<'_>,
    learner: &mut Learner,
    old: &mut Ema,
    collected: &Collected,
    step: &mut Step,
) -> Result<(), TrainError> {
    let (recipe, engine) = (run.recipe, &run.engine);
    let actor = &recipe.actor;
    let model = engine.pipe.denoiser();
    let reference = run.reference.as_ref().expect("dgpo always has a reference");
    let kept = &collected.kept;
    let device = kept.device.device();

    let advantages = step
        .timers
        .time("adv", || collected.advantages(1, &recipe.advantage, &mut step.metrics))?
        .select(1, 0);

    let update = crate::perf::ActorUpdate::start();
    let x0 = collected.batch.trajectory.final_latents.index_select(0, &kept.device);
    let text = collected.batch.text.rows_at(&kept.host);
    let grid = &engine.grid.timesteps;
    let range = actor.dgpo.train_timestep_range.unwrap_or([0, grid.len()]);
    if range[1] > grid.len() {
        return Err(TrainError::Invalid(format!(
            "actor.dgpo.train_timestep_range [{}, {}] reaches past the {} rollout steps",
            range[0],
            range[1],
            grid.len()
        )));
    }
    let span = range[1] - range[0];
    let count = actor
        .dgpo
        .train_timestep_count
        .unwrap_or(((span as f64 * actor.timestep_fraction) as usize).max(1));
    let timesteps = shared_timesteps(range, count, recipe.seed, step.number);
    let groups = groups_of(&collected.uids);
    let owned: Vec<bool> = groups.iter().map(|group| collected.owned.contains(&group[0])).collect();
    let trainer = &recipe.trainer;
    let batching = Batching {
        items: groups.len(),
        owned,
        mini: trainer.ppo_mini_batch_size,
        micro: (trainer.micro_batch_size / recipe.rollout.n).max(1),
    };
    let settings = DgpoSettings {
        beta: actor.dgpo.beta,
        clip_range: actor.dgpo.clip_range,
        ref_kl_coef: actor.ref_kl_coef,
        adv_clip_max: actor.adv_clip_max,
    };
    let params = learner
        .optimizer
        .params
        .iter()
        .map(|(name, param)| (name.clone(), param.shallow_clone()))
        .collect();
    let result = optimize(learner, run, batching, step.number, step.lr, |micro, pass| {
        // This rank's rows of the micro-batch's groups, and each row's group within it.
        let (mut local, mut member_of) = (vec![], vec![]);
        for (member, &group) in micro.iter().enumerate() {
            for &row in &groups[group] {
                local.push((row - collected.owned.start) as i64);
                member_of.push(member as i64);
            }
        }
        let idx = upload(Tensor::from_slice(&local), device);
        let member_of = upload(Tensor::from_slice(&member_of), device);
        let (x0, text, advantages) =
            (x0.index_select(0, &idx), text.rows_at(&local), advantages.index_select(0, &idx));
        pass.slots(timesteps.len(), |slot| {
            let sigma = Tensor::full(
                [local.len() as i64],
                (grid[timesteps[slot]] / 1000.0) as f64,
                (x0.kind(), device),
            );
            let mut one = x0.size();
            one[0] = 1;
            let noise = Tensor::cat(
                &micro
                    .iter()
                    .map(|&group| {
                        let stream = row_seed(
                            recipe.seed ^ DGPO_SALT,
                            step.number,
                            (group * timesteps.len() + slot) as u64,
                        );
                        let noise = SampleRng::new(stream).normal(&one, device);
                        noise.repeat_interleave_self_int(groups[group].len() as i64, 0, None)
                    })
                    .collect::<Vec<_>>(),
                0,
            );
            let sigma_rows = per_row(&sigma, &x0);
            let xt = (1.0 - &sigma_rows) * &x0 + &sigma_rows * &noise;
            let [old_pred, ref_pred, policy_pred] =
                predictions(model, old, &params, reference, (&xt, &sigma, &text))?;
            let output = dgpo_loss(
                &DgpoBatch {
                    x0: &x0,
                    noise: &noise,
                    advantages: &advantages,
                    groups: &member_of,
                    policy_pred: &policy_pred,
                    old_pred: &old_pred,
                    ref_pred: &ref_pred,
                },
                settings,
            )?;
            Ok(SlotLoss { what: format!("dgpo timestep slot {slot}"), output })
        })
    });
    super::old_policy::follow(old, actor, &learner.optimizer.params, step);
    step.metrics.extend(result?);
    update.finish(&mut step.metrics);
    Ok(())
}
