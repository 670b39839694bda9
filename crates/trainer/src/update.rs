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

/// The trainable state every algorithm shares: the optimizer (which holds the parameters) and
/// the evaluation EMA. An algorithm's own copies of the weights are its own.
pub(crate) struct Learner {
    pub optimizer: AdamW,
    pub ema: Option<Ema>,
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
        for (k, v) in metrics {
            let e = self.0.entry(k.clone()).or_default();
            e.0 += v * weight;
            e.1 += weight;
        }
    }

    /// Every rank's sums together.
    pub fn merge(parts: Vec<MetricMeans>) -> Self {
        let mut all = Self::default();
        for (k, (s, w)) in parts.into_iter().flat_map(|p| p.0) {
            let e = all.0.entry(k).or_default();
            e.0 += s;
            e.1 += w;
        }
        all
    }

    pub fn means(self) -> Metrics {
        self.0.into_iter().map(|(k, (s, w))| (k, s / w)).collect()
    }
}

/// How the step's training units (samples, pairs) are batched, and which this rank holds.
pub(crate) struct Batching {
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
        let t = &recipe.trainer;
        Self {
            items,
            owned: (0..items).map(|i| owned.contains(&i)).collect(),
            mini: t.ppo_mini_batch_size * recipe.rollout.n,
            micro: t.micro_batch_size,
        }
    }
}

/// Runs `trainer.ppo_epochs` passes over `batching.items` units at training step `k`.
/// `micro_step(units, scale, backward)` computes the losses of some of this rank's units (indices
/// into the whole step), backpropagates each times `scale` through `backward`, and returns its
/// metrics. Returns the means over
/// all ranks plus `actor/grad_norm` and `actor/skipped_steps`.
pub(crate) fn optimize(
    learner: &mut Learner,
    run: &Run<'_>,
    batching: Batching,
    k: u64,
    lr: f64,
    mut micro_step: impl FnMut(&[usize], f64, &Backward) -> Result<Metrics, TrainError>,
) -> Result<Metrics, TrainError> {
    let (recipe, comm) = (run.recipe, &run.comm);
    let t = &recipe.trainer;
    let mut means = MetricMeans::default();
    let (mut grad_norms, mut skipped) = (vec![], 0.0);
    let sharded_blocks = comm.shards_blocks(recipe);
    let blocks = run.engine.pipe.denoiser().sharded();
    let trained_blocks = blocks.filter(|s| s.trains());
    // What a rank with fewer passes than the others repeats (any unit it holds).
    let filler: Vec<usize> = batching.owned.iter().position(|&o| o).into_iter().collect();
    for epoch in 0..t.ppo_epochs {
        let mut order: Vec<usize> = (0..batching.items).collect();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(crate::seeds::shuffle(recipe.seed, k, epoch)));
        for mb in order.chunks(batching.mini.max(1)) {
            let mine: Vec<usize> = mb.iter().copied().filter(|&i| batching.owned[i]).collect();
            let whole = learner.optimizer.whole_params();
            let backward = Backward {
                blocks,
                exact: RefCell::new(t.exact_gradient_sum.then(|| ExactSum::new(&whole))),
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
                    Some(micro) => (*micro, micro.len() as f64 / mb.len() as f64),
                    None => (&filler[..], 0.0),
                };
                let metrics = micro_step(micro, share, &backward)?;
                if share > 0.0 {
                    means.add_weighted(&metrics, micro.len() as f64);
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
            let local_sq = if optimizer.local.is_empty() { 0.0 } else { comm.sum_f64(local_sq)? };
            let norm = optimizer.clip_to((whole_sq + local_sq).sqrt(), t.max_grad_norm);
            if norm.is_finite() {
                optimizer.step(lr, &untouched);
                if let Some(owners) = &optimizer.owners {
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
    let mut m = MetricMeans::merge(comm.gather(&means)?).means();
    let mean_norm = if grad_norms.is_empty() {
        f64::NAN
    } else {
        grad_norms.iter().sum::<f64>() / grad_norms.len() as f64
    };
    m.insert("actor/grad_norm".into(), mean_norm);
    m.insert("actor/skipped_steps".into(), skipped);
    Ok(m)
}

/// How a micro-step backpropagates a loss: autograd's backward, then (trained sharded blocks) the
/// last block's gradients summed over the ranks into its slice, then (`exact_gradient_sum`) the
/// gradients moved into the f64 sum. Summing every backward's gradients in f64 makes the sum the
/// same however the rows and the blocks' gradients are split.
pub(crate) struct Backward<'a> {
    blocks: Option<&'a ShardedBlocks>,
    exact: RefCell<Option<ExactSum>>,
    whole: &'a BTreeMap<String, Tensor>,
}

impl Backward<'_> {
    pub fn run(&self, loss: &Tensor) -> Result<(), TrainError> {
        let done = loss.f_backward();
        // A sharded block's collective that failed inside backward says why.
        if let Some(e) = self.blocks.and_then(ShardedBlocks::take_failure) {
            return Err(e.into());
        }
        done?;
        if let Some(blocks) = self.blocks.filter(|b| b.trains()) {
            blocks.release()?;
        }
        if let Some(sum) = self.exact.borrow_mut().as_mut() {
            sum.absorb(self.whole);
        }
        Ok(())
    }
}

/// Fails on a non-finite loss before it reaches the weights; returns its value.
pub(crate) fn finite_loss(loss: &tch::Tensor, k: u64, what: &str) -> Result<f64, TrainError> {
    let value = loss.double_value(&[]);
    if value.is_finite() {
        Ok(value)
    } else {
        Err(TrainError::Diverged(format!(
            "step {k}: the loss is {value} ({what}); stopping before it reaches the weights"
        )))
    }
}
