//! The optimisation pass every algorithm shares: epochs over shuffled mini-batches, each split into
//! micro-batches whose losses are backpropagated as they come (each weighted by its share of the
//! mini-batch), gradients summed over the ranks, then one clipped AdamW step per mini-batch —
//! skipped, and counted, when the gradient norm is not finite. Under data parallelism every rank
//! draws the same mini-batches of the whole step and trains the units it holds, so the update is
//! the one a single process would make on the whole batch.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::Range;

use flowtune_config::Recipe;
use flowtune_models::shard::ShardedBlocks;
use flowtune_objectives::losses::LossOutput;
use flowtune_objectives::Metrics;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::dist::ExactSum;
use crate::optim::{AdamW, Ema};
use crate::run::Run;
use crate::TrainError;

/// The trainable state every algorithm shares: the optimizer (which holds the parameters), the
/// evaluation EMA and the sampling copy of an off-policy lag. An algorithm's own copies of the
/// weights are its own.
pub struct Learner {
    pub optimizer: AdamW,
    pub ema: Option<Ema>,
    /// Under `trainer.off_policy_lag: 1`, the weights one update behind the trained ones, which
    /// each step samples with (see [`crate::collect::collect_behaviour`]).
    pub lagged: Option<Ema>,
}

/// Weighted means of metrics over the passes (and ranks) that reported them.
#[derive(Default, Serialize, Deserialize)]
pub(crate) struct MetricMeans(BTreeMap<String, (f64, f64)>);

impl MetricMeans {
    pub fn add(&mut self, metrics: &Metrics) {
        self.add_weighted(metrics, 1.0);
    }

    /// Adds `metrics` as `weight` units' worth (a micro-batch's samples).
    pub fn add_weighted(&mut self, metrics: &Metrics, weight: f64) {
        for (key, value) in metrics {
            let entry = self.0.entry(key.clone()).or_default();
            entry.0 += value * weight;
            entry.1 += weight;
        }
    }

    /// Every rank's sums together.
    pub fn merge(parts: Vec<MetricMeans>) -> Self {
        let mut all = Self::default();
        for (key, (sum, weight)) in parts.into_iter().flat_map(|part| part.0) {
            let entry = all.0.entry(key).or_default();
            entry.0 += sum;
            entry.1 += weight;
        }
        all
    }

    pub fn means(self) -> Metrics {
        self.0.into_iter().map(|(key, (sum, weight))| (key, sum / weight)).collect()
    }
}

/// How the step's training units (samples, pairs) are batched, and which this rank holds.
pub struct Batching {
    /// Units of the whole step, over all ranks.
    pub items: usize,
    /// Which units this rank holds and trains (all of them in a world of one).
    pub owned: Vec<bool>,
    /// Units per optimizer step.
    pub mini: usize,
    /// Units per forward/backward pass.
    pub micro: usize,
}

impl Batching {
    /// The step's samples of prompt groups, this rank holding `owned`: `trainer.ppo_mini_batch_size`
    /// groups of `rollout.n` per optimizer step, `trainer.micro_batch_size` samples per pass.
    pub fn groups(recipe: &Recipe, items: usize, owned: Range<usize>) -> Self {
        let trainer = &recipe.trainer;
        Self {
            items,
            owned: (0..items).map(|unit| owned.contains(&unit)).collect(),
            mini: trainer.ppo_mini_batch_size * recipe.rollout.n,
            micro: trainer.micro_batch_size,
        }
    }
}

/// Runs `trainer.ppo_epochs` passes over `batching.items` units at training step `step`.
/// `micro_step(units, pass)` computes the losses of some of this rank's units (indices into the
/// whole step) slot by slot through [`MicroPass::slots`], which checks them, backpropagates them
/// and averages their metrics. Returns the means over all ranks plus `actor/grad_norm` and
/// `actor/skipped_steps`.
pub fn optimize(
    learner: &mut Learner,
    run: &Run<'_>,
    batching: Batching,
    step: u64,
    lr: f64,
    mut micro_step: impl FnMut(&[usize], &mut MicroPass) -> Result<(), TrainError>,
) -> Result<Metrics, TrainError> {
    let (recipe, comm) = (run.recipe, &run.comm);
    let trainer = &recipe.trainer;
    let mut means = MetricMeans::default();
    let (mut grad_norms, mut skipped) = (vec![], 0.0);
    let sharded_blocks = run.layout.sharded_blocks;
    let blocks = run.engine.pipe.denoiser().sharded();
    let trained_blocks = blocks.filter(|blocks| blocks.trains());
    // What a rank with fewer passes than the others repeats (any unit it holds).
    let filler: Vec<usize> = batching.owned.iter().position(|&owns| owns).into_iter().collect();
    for epoch in 0..trainer.ppo_epochs {
        let mut order: Vec<usize> = (0..batching.items).collect();
        let seed = crate::seeds::shuffle(recipe.seed, step, epoch);
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
        for mini_batch in order.chunks(batching.mini.max(1)) {
            let mine: Vec<usize> =
                mini_batch.iter().copied().filter(|&unit| batching.owned[unit]).collect();
            let whole = learner.optimizer.whole_params();
            let backward = Backward {
                blocks,
                exact: RefCell::new(trainer.exact_gradient_sum.then(|| ExactSum::new(&whole))),
                whole: &whole,
            };
            let micros: Vec<&[usize]> = mine.chunks(batching.micro.max(1)).collect();
            // Sharded blocks are gathered by every rank together, so every rank runs as many
            // passes as the busiest one: the others repeat a pass at weight 0 (adding zeros).
            let passes = match sharded_blocks {
                true => comm.gather::<usize>(&micros.len())?.into_iter().max().unwrap_or(0),
                false => micros.len(),
            };
            for pass in 0..passes {
                let (micro, share) = match micros.get(pass) {
                    Some(micro) => (*micro, micro.len() as f64 / mini_batch.len() as f64),
                    None => (&filler[..], 0.0),
                };
                let mut micro_pass =
                    MicroPass { step, share, backward: &backward, means: MetricMeans::default() };
                micro_step(micro, &mut micro_pass)?;
                if share > 0.0 {
                    means.add_weighted(&micro_pass.means.means(), micro.len() as f64);
                }
            }
            if let Some(blocks) = trained_blocks {
                blocks.take_gradients()?;
            }
            let optimizer = &mut learner.optimizer;
            let untouched = match backward.exact.into_inner() {
                Some(sum) => comm.sum_exact(&whole, sum)?,
                None => comm.sum_gradients(&whole)?,
            };
            let (whole_sq, local_sq) = optimizer.grad_squares();
            let local_sq = if optimizer.local().is_empty() { 0.0 } else { comm.sum_f64(local_sq)? };
            let norm = optimizer.clip_to((whole_sq + local_sq).sqrt(), trainer.max_grad_norm);
            if norm.is_finite() {
                optimizer.step(lr, &untouched);
                if let Some(owners) = optimizer.owners() {
                    comm.broadcast_from_owners(&optimizer.params, owners)?;
                }
                if let Some(ema) = learner.ema.as_mut() {
                    ema.update(&optimizer.params);
                }
                grad_norms.push(norm);
            } else {
                skipped += 1.0;
            }
            optimizer.zero_grad();
        }
    }
    let mut metrics = MetricMeans::merge(comm.gather(&means)?).means();
    let mean_norm = if grad_norms.is_empty() {
        f64::NAN
    } else {
        grad_norms.iter().sum::<f64>() / grad_norms.len() as f64
    };
    metrics.insert("actor/grad_norm".into(), mean_norm);
    metrics.insert("actor/skipped_steps".into(), skipped);
    Ok(metrics)
}

/// One slot's loss (a window step's, a timestep's) with its metrics, and what the message calls
/// the slot if the loss is not finite.
pub struct SlotLoss {
    pub what: String,
    pub output: LossOutput,
}

/// One forward/backward pass over a micro-batch, which the algorithm fills slot by slot.
pub struct MicroPass<'a> {
    step: u64,
    /// The micro-batch's share of its mini-batch (0 for a repeated pass).
    share: f64,
    backward: &'a Backward<'a>,
    /// The pass's metrics over its slots.
    means: MetricMeans,
}

impl MicroPass<'_> {
    /// Computes the losses of `count` slots in turn with `loss(slot)`: fails on a non-finite one,
    /// adds its metrics and `actor/loss` to the pass's means and backpropagates it at `1/count` of
    /// the pass's share.
    pub fn slots(
        &mut self,
        count: usize,
        mut loss: impl FnMut(usize) -> Result<SlotLoss, TrainError>,
    ) -> Result<(), TrainError> {
        for slot in 0..count {
            let SlotLoss { what, output } = loss(slot)?;
            let total = finite_loss(&output.loss, self.step, &what)?;
            self.means.add(&output.metrics);
            self.means.add(&Metrics::from([("actor/loss".to_string(), total)]));
            self.backward.run(&(output.loss * (self.share / count as f64)))?;
        }
        Ok(())
    }
}

/// How a micro-step backpropagates a loss: autograd's backward, then (trained sharded blocks) the
/// last block's gradients summed over the ranks into its slice, then (`exact_gradient_sum`) the
/// gradients moved into the f64 sum. Summing every backward's gradients in f64 makes the sum the
/// same however the rows and the blocks' gradients are split.
struct Backward<'a> {
    blocks: Option<&'a ShardedBlocks>,
    exact: RefCell<Option<ExactSum>>,
    whole: &'a BTreeMap<String, Tensor>,
}

impl Backward<'_> {
    fn run(&self, loss: &Tensor) -> Result<(), TrainError> {
        let done = loss.f_backward();
        // A sharded block's collective that failed inside backward says why.
        if let Some(failure) = self.blocks.and_then(ShardedBlocks::take_failure) {
            return Err(failure.into());
        }
        done?;
        if let Some(blocks) = self.blocks.filter(|blocks| blocks.trains()) {
            blocks.release()?;
        }
        if let Some(sum) = self.exact.borrow_mut().as_mut() {
            sum.absorb(self.whole);
        }
        Ok(())
    }
}

/// Fails on a non-finite loss before it reaches the weights; returns its value.
fn finite_loss(loss: &Tensor, step: u64, what: &str) -> Result<f64, TrainError> {
    let value = loss.double_value(&[]);
    if value.is_finite() {
        Ok(value)
    } else {
        Err(TrainError::Diverged(format!(
            "step {step}: the loss is {value} ({what}); stopping before it reaches the weights"
        )))
    }
}
