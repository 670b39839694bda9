//! The optimisation pass every algorithm shares: epochs over shuffled mini-batches, each split into
//! micro-batches whose losses are backpropagated as they come (`loss / #micro-batches`), then one
//! clipped AdamW step per mini-batch — skipped, and counted, when the gradient norm is not finite.

use std::collections::BTreeMap;

use flowtune_config::Recipe;
use flowtune_objectives::Metrics;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::optim::{AdamW, Ema};
use crate::TrainError;

/// The trainable state: the optimizer (which holds the parameters), the evaluation EMA, and
/// DiffusionNFT's old (sampling) policy, a lagging copy of the parameters.
pub(crate) struct Learner {
    pub optimizer: AdamW,
    pub ema: Option<Ema>,
    pub old: Option<Ema>,
}

/// Averages metrics over the micro-batches that reported them.
#[derive(Default)]
pub(crate) struct MetricMeans(BTreeMap<String, (f64, usize)>);

impl MetricMeans {
    pub fn add(&mut self, metrics: &Metrics) {
        for (k, v) in metrics {
            let e = self.0.entry(k.clone()).or_default();
            e.0 += v;
            e.1 += 1;
        }
    }

    pub fn means(self) -> Metrics {
        self.0.into_iter().map(|(k, (s, c))| (k, s / c as f64)).collect()
    }
}

/// How `items` training units (samples, pairs) are batched.
pub(crate) struct Batching {
    pub items: usize,
    /// Units per optimizer step.
    pub mini: usize,
    /// Units per forward/backward pass.
    pub micro: usize,
}

impl Batching {
    /// `items` samples of prompt groups: `trainer.ppo_mini_batch_size` groups of `rollout.n` per
    /// optimizer step, `trainer.micro_batch_size` samples per pass.
    pub fn groups(recipe: &Recipe, items: usize) -> Self {
        let t = &recipe.trainer;
        Self { items, mini: t.ppo_mini_batch_size * recipe.rollout.n, micro: t.micro_batch_size }
    }
}

/// Runs `trainer.ppo_epochs` passes over `batching.items` units at training step `k`.
/// `micro_step(units, scale)` computes its losses, backpropagates each times `scale`, and returns
/// its metrics. Returns the means plus `actor/grad_norm` and `actor/skipped_steps`.
pub(crate) fn optimize(
    learner: &mut Learner,
    recipe: &Recipe,
    batching: Batching,
    k: u64,
    lr: f64,
    mut micro_step: impl FnMut(&[usize], f64) -> Result<Metrics, TrainError>,
) -> Result<Metrics, TrainError> {
    let t = &recipe.trainer;
    let mut means = MetricMeans::default();
    let (mut grad_norms, mut skipped) = (vec![], 0.0);
    for epoch in 0..t.ppo_epochs {
        let mut order: Vec<usize> = (0..batching.items).collect();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(crate::seeds::shuffle(recipe.seed, k, epoch)));
        for mb in order.chunks(batching.mini.max(1)) {
            let micros: Vec<&[usize]> = mb.chunks(batching.micro.max(1)).collect();
            let scale = 1.0 / micros.len() as f64;
            for micro in &micros {
                means.add(&micro_step(micro, scale)?);
            }
            let optimizer = &mut learner.optimizer;
            let norm = optimizer.clip_grad_norm(t.max_grad_norm);
            if norm.is_finite() {
                optimizer.step(lr);
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
    let mut m = means.means();
    let mean_norm = if grad_norms.is_empty() {
        f64::NAN
    } else {
        grad_norms.iter().sum::<f64>() / grad_norms.len() as f64
    };
    m.insert("actor/grad_norm".into(), mean_norm);
    m.insert("actor/skipped_steps".into(), skipped);
    Ok(m)
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
