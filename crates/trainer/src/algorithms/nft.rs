//! A DiffusionNFT step: the rollout (sampled by the old adapter) gives clean final
//! latents; group advantages become optimality probabilities; on a random subset of the rollout's
//! timesteps each sample is re-noised with fresh noise and three velocities are compared — old
//! adapter, trained adapter, reference — then the old adapter follows the trained one.

use std::collections::BTreeMap;

use flowtune_models::{velocity_at_sigma, TextConditioning, TrainableDenoiser};
use flowtune_objectives::losses::{nft_loss, reward_probability, NftBatch};
use flowtune_sampling::{per_row, row_seed, upload, SampleRng};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tch::Tensor;

use super::old_policy::OldPolicy;
use super::Algorithm;
use crate::collect::Collected;
use crate::optim::Ema;
use crate::reference::Reference;
use crate::run::Run;
use crate::seeds::NFT_SALT;
use crate::source::Source;
use crate::stateful::Stateful;
use crate::step::Step;
use crate::update::{optimize, Batching, Learner, SlotLoss};
use crate::TrainError;

/// DiffusionNFT: the old policy samples, the forward-process loss trains.
#[derive(Default)]
pub(crate) struct Nft {
    /// The old policy: a copy of the trained weights that samples and follows them.
    old: OldPolicy,
}

/// Its old policy is a shadow; nothing else carries over.
impl Stateful for Nft {}

impl Algorithm for Nft {
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
        let (collected, old) = self.old.collect("diffusion_nft", run, learner, source, step)?;
        nft_step(run, learner, old, &collected, step)?;
        Ok(collected.batch.images.len())
    }
}

/// The trained timestep indices of each of `rows` samples: `max(1, ⌊N·fraction⌋)` of the N, drawn
/// without replacement.
pub(crate) fn trained_timesteps(
    rows: usize,
    timesteps: usize,
    fraction: f64,
    seed: u64,
    step: u64,
) -> Vec<Vec<usize>> {
    let count = ((timesteps as f64 * fraction) as usize).clamp(1, timesteps);
    let mut rng = ChaCha8Rng::seed_from_u64(row_seed(seed ^ NFT_SALT, step, u64::MAX >> 2));
    (0..rows)
        .map(|_| {
            let mut all: Vec<usize> = (0..timesteps).collect();
            all.shuffle(&mut rng);
            all.truncate(count);
            all
        })
        .collect()
}

/// Advantages, the NFT update and the old-adapter refresh of training step `step`.
fn nft_step(
    run: &Run<'_>,
    learner: &mut Learner,
    old: &mut Ema,
    collected: &Collected,
    step: &mut Step,
) -> Result<(), TrainError> {
    let (recipe, engine) = (run.recipe, &run.engine);
    let actor = &recipe.actor;
    let model = engine.pipe.denoiser();
    let reference = run.reference.as_ref().expect("diffusion_nft always has a reference");
    let kept = &collected.kept;
    let device = kept.device.device();

    let prob = step.timers.time("adv", || -> Result<Tensor, TrainError> {
        let advantages = collected.advantages(1, &recipe.advantage, &mut step.metrics)?;
        let advantages = advantages.select(1, 0);
        Ok(reward_probability(&advantages, actor.nft.reward_mode, actor.adv_clip_max)
            .to_device(device))
    })?;

    let update = crate::perf::ActorUpdate::start();
    let x0 = collected.batch.trajectory.final_latents.index_select(0, &kept.device);
    let text = collected.batch.text.rows_at(&kept.host);
    let grid = &engine.grid.timesteps;
    let samples = collected.rewards.len();
    let chosen =
        trained_timesteps(samples, grid.len(), actor.timestep_fraction, recipe.seed, step.number);
    let slots = chosen[0].len();
    let batching = Batching::groups(recipe, samples, collected.owned.clone());
    let params = learner
        .optimizer
        .params
        .iter()
        .map(|(name, param)| (name.clone(), param.shallow_clone()))
        .collect();
    let result = optimize(learner, run, batching, step.number, step.lr, |micro, pass| {
        // `micro` holds step-wide positions; this rank's tensors start at `collected.owned.start`.
        let first = collected.owned.start;
        let local = micro.iter().map(|&sample| (sample - first) as i64).collect::<Vec<_>>();
        let idx = upload(Tensor::from_slice(&local), device);
        let (x0, text, prob) =
            (x0.index_select(0, &idx), text.rows_at(&local), prob.index_select(0, &idx));
        pass.slots(slots, |slot| {
            let sigma: Vec<f32> =
                micro.iter().map(|&sample| grid[chosen[sample][slot]] / 1000.0).collect();
            let sigma = Tensor::from_slice(&sigma).to_device(device);
            let noise = Tensor::cat(
                &micro
                    .iter()
                    .map(|&sample| {
                        let stream = row_seed(
                            recipe.seed ^ NFT_SALT,
                            step.number,
                            (sample * slots + slot) as u64,
                        );
                        let mut shape = x0.size();
                        shape[0] = 1;
                        SampleRng::new(stream).normal(&shape, device)
                    })
                    .collect::<Vec<_>>(),
                0,
            );
            let sigma_rows = per_row(&sigma, &x0);
            let xt = (1.0 - &sigma_rows) * &x0 + &sigma_rows * &noise;
            let [old_pred, ref_pred, policy_pred] =
                predictions(model, old, &params, reference, (&xt, &sigma, &text))?;
            let output = nft_loss(
                &NftBatch {
                    x0: &x0,
                    xt: &xt,
                    t: &sigma,
                    reward_prob: &prob,
                    policy_pred: &policy_pred,
                    old_pred: &old_pred,
                    ref_pred: &ref_pred,
                },
                actor.nft.beta,
                actor.ref_kl_coef,
                actor.adv_clip_max,
            )?;
            Ok(SlotLoss { what: format!("nft timestep slot {slot}"), output })
        })
    });
    super::old_policy::follow(old, actor, &learner.optimizer.params, step);
    step.metrics.extend(result?);
    update.finish(&mut step.metrics);
    Ok(())
}

/// The old policy's (no grad), the reference's (no grad) and the trained model's velocity at the
/// re-noised latents `xt` of noise level `sigma` under `text` (DiffusionNFT, DGPO).
pub(crate) fn predictions(
    model: &dyn TrainableDenoiser,
    old: &mut Ema,
    params: &BTreeMap<String, Tensor>,
    reference: &Reference,
    (xt, sigma, text): (&Tensor, &Tensor, &TextConditioning),
) -> Result<[Tensor; 3], TrainError> {
    let old_pred =
        tch::no_grad(|| old.with_swapped(params, || velocity_at_sigma(model, xt, sigma, text)))?;
    let ref_pred =
        tch::no_grad(|| reference.run(model, |net| velocity_at_sigma(net, xt, sigma, text)))?;
    Ok([old_pred, ref_pred, velocity_at_sigma(model, xt, sigma, text)?])
}
