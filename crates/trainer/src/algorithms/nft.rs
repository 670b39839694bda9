//! A DiffusionNFT step: the rollout (sampled by the old adapter) gives clean final
//! latents; group advantages become optimality probabilities; on a random subset of the rollout's
//! timesteps each sample is re-noised with fresh noise and three velocities are compared — old
//! adapter, trained adapter, reference — then the old adapter follows the trained one.

use std::collections::BTreeMap;
use std::time::Instant;

use flowtune_config::Recipe;
use flowtune_models::{velocity_at_sigma, TextConditioning, TrainableDenoiser};
use flowtune_objectives::losses::{nft_loss, reward_probability, NftBatch};
use flowtune_objectives::Metrics;
use flowtune_sampling::{per_row, row_seed, SampleRng};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tch::Tensor;

use super::Algorithm;
use crate::collect::Collected;
use crate::optim::Ema;
use crate::reference::Reference;
use crate::run::Run;
use crate::seeds::NFT_SALT;
use crate::source::Source;
use crate::update::{finite_loss, optimize, Batching, Learner, MetricMeans};
use crate::TrainError;

/// DiffusionNFT: the old policy samples, the forward-process loss trains.
#[derive(Default)]
pub(crate) struct Nft {
    /// The old policy: a copy of the trained weights that samples and follows them.
    old: Option<Ema>,
}

impl Algorithm for Nft {
    fn needs_reference(&self, _: &Recipe) -> bool {
        true
    }

    fn start(&mut self, params: &BTreeMap<String, Tensor>, host: bool) {
        self.old = Some(Ema::new(0.0, params, host));
    }

    fn shadows(&self) -> Vec<(&'static str, &Ema)> {
        self.old.iter().map(|old| ("old", old)).collect()
    }

    fn step(
        &mut self,
        run: &Run<'_>,
        learner: &mut Learner,
        source: &mut Source,
        k: u64,
        lr: f64,
        m: &mut Metrics,
    ) -> Result<usize, TrainError> {
        let old = super::started(&mut self.old, "diffusion_nft")?;
        let c = super::collect_with_old_policy(run, learner, old, source, k, m)?;
        nft_step(run, learner, old, &c, k, lr, m)?;
        Ok(c.batch.images.len())
    }
}

/// The trained timestep indices of each of `rows` samples: `max(1, ⌊N·fraction⌋)` of the N, drawn
/// without replacement.
pub(crate) fn trained_timesteps(
    rows: usize,
    steps: usize,
    fraction: f64,
    seed: u64,
    k: u64,
) -> Vec<Vec<usize>> {
    let count = ((steps as f64 * fraction) as usize).clamp(1, steps);
    let mut rng = ChaCha8Rng::seed_from_u64(row_seed(seed ^ NFT_SALT, k, u64::MAX >> 2));
    (0..rows)
        .map(|_| {
            let mut all: Vec<usize> = (0..steps).collect();
            all.shuffle(&mut rng);
            all.truncate(count);
            all
        })
        .collect()
}

/// Advantages, the NFT update and the old-adapter refresh of training step `k`.
fn nft_step(
    run: &Run<'_>,
    learner: &mut Learner,
    old: &mut Ema,
    c: &Collected,
    k: u64,
    lr: f64,
    m: &mut Metrics,
) -> Result<(), TrainError> {
    let (recipe, engine) = (run.recipe, &run.engine);
    let actor = &recipe.actor;
    let model = engine.pipe.denoiser();
    let reference = run.reference.as_ref().expect("diffusion_nft always has a reference");
    let device = c.kept.device();

    let timer = Instant::now();
    let a = c.advantages(1, &recipe.advantage, m)?.select(1, 0);
    let prob = reward_probability(&a, actor.reward_mode, actor.adv_clip_max).to_device(device);
    m.insert("timing_s/adv".into(), timer.elapsed().as_secs_f64());

    let update = crate::perf::ActorUpdate::start();
    let x0 = c.batch.trajectory.final_latents.index_select(0, &c.kept);
    let text = c.batch.text.rows(&c.kept);
    let grid = &engine.grid.timesteps;
    let chosen =
        trained_timesteps(c.rewards.len(), grid.len(), actor.timestep_fraction, recipe.seed, k);
    let slots = chosen[0].len();
    let batching = Batching::groups(recipe, c.rewards.len(), c.owned.clone());
    let params =
        learner.optimizer.params.iter().map(|(n, p)| (n.clone(), p.shallow_clone())).collect();
    let result = optimize(learner, run, batching, k, lr, |micro, scale, backward| {
        // `micro` holds step-wide positions; this rank's tensors start at `c.owned.start`.
        let idx = micro.iter().map(|&i| (i - c.owned.start) as i64).collect::<Vec<_>>();
        let idx = Tensor::from_slice(&idx).to_device(device);
        let (x0, text, prob) =
            (x0.index_select(0, &idx), text.rows(&idx), prob.index_select(0, &idx));
        let mut means = MetricMeans::default();
        for j in 0..slots {
            let sigma: Vec<f32> = micro.iter().map(|&i| grid[chosen[i][j]] / 1000.0).collect();
            let sigma = Tensor::from_slice(&sigma).to_device(device);
            let noise = Tensor::cat(
                &micro
                    .iter()
                    .map(|&i| {
                        let stream = row_seed(recipe.seed ^ NFT_SALT, k, (i * slots + j) as u64);
                        let mut shape = x0.size();
                        shape[0] = 1;
                        SampleRng::new(stream).normal(&shape, device)
                    })
                    .collect::<Vec<_>>(),
                0,
            );
            let s = per_row(&sigma, &x0);
            let xt = (1.0 - &s) * &x0 + &s * &noise;
            let [old_pred, ref_pred, policy_pred] =
                predictions(model, old, &params, reference, (&xt, &sigma, &text))?;
            let out = nft_loss(
                &NftBatch {
                    x0: &x0,
                    xt: &xt,
                    t: &sigma,
                    reward_prob: &prob,
                    policy_pred: &policy_pred,
                    old_pred: &old_pred,
                    ref_pred: &ref_pred,
                },
                actor.mix_beta,
                actor.ref_kl_coef,
                actor.adv_clip_max,
            )?;
            let total = finite_loss(&out.loss, k, &format!("nft timestep slot {j}"))?;
            means.add(&out.metrics);
            means.add(&Metrics::from([("actor/loss".to_string(), total)]));
            backward.run(&(out.loss * (scale / slots as f64)))?;
        }
        Ok(means.means())
    });
    if k.is_multiple_of(actor.old_policy_update_interval) {
        old.decay = actor.old_policy_decay.decay(k);
        old.update(&learner.optimizer.params);
        m.insert("actor/old_policy_decay".into(), old.decay);
    }
    m.extend(result?);
    update.finish(m);
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
