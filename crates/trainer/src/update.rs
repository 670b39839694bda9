//! The actor update of one training step: PPO epochs over shuffled mini-batches of samples,
//! micro-batches with one backward per trained window step (`loss / (#micro-batches × W)`),
//! and one clipped AdamW step per mini-batch.

use std::collections::BTreeMap;

use flowtune_config::Recipe;
use flowtune_models::sd3::Sd3Transformer;
use flowtune_objectives::losses::{kl_to_reference, PolicyBatch, PolicyLoss};
use flowtune_objectives::Metrics;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tch::Tensor;

use crate::engine::{Engine, RolloutBatch};
use crate::optim::{AdamW, Ema};
use crate::TrainError;

/// Old-policy quantities of every (row, window step): log-probs and transition means.
pub(crate) struct OldPolicy {
    pub log_probs: Tensor,
    pub means: Option<Tensor>,
    pub std: Option<Tensor>,
    pub sqrt_dt: Option<Tensor>,
}

/// Replays every window step of all rows with `model` without gradient.
pub(crate) fn replay_all(
    engine: &Engine<'_>,
    model: &Sd3Transformer,
    batch: &RolloutBatch,
    rows: &Tensor,
    w: i64,
    keep_means: bool,
) -> Result<OldPolicy, TrainError> {
    tch::no_grad(|| {
        let (mut lp, mut means, mut std, mut dt) = (vec![], vec![], vec![], vec![]);
        for j in 0..w {
            let out = engine.replay_with(model, batch, rows, j)?;
            lp.push(out.log_prob);
            if keep_means {
                means.push(out.prev_sample_mean);
                std.push(out.std_dev_t.reshape([-1]));
                dt.push(out.sqrt_dt.reshape([-1]));
            }
        }
        let stack = |v: Vec<Tensor>| (!v.is_empty()).then(|| Tensor::stack(&v, 1));
        Ok(OldPolicy {
            log_probs: Tensor::stack(&lp, 1),
            means: stack(means),
            std: stack(std),
            sqrt_dt: stack(dt),
        })
    })
}

fn mean_into(acc: &mut BTreeMap<String, (f64, usize)>, metrics: &Metrics) {
    for (k, v) in metrics {
        let e = acc.entry(k.clone()).or_default();
        e.0 += v;
        e.1 += 1;
    }
}

/// What the update reads.
pub(crate) struct UpdateInputs<'a> {
    pub engine: &'a Engine<'a>,
    pub batch: &'a RolloutBatch,
    /// Batch rows that train (those kept by the reward policy).
    pub rows: &'a Tensor,
    pub old: &'a OldPolicy,
    pub reference: Option<&'a OldPolicy>,
    /// (kept rows, W)
    pub advantages: &'a Tensor,
    pub loss: PolicyLoss,
    pub window: i64,
}

/// Runs the update of training step `k` at learning rate `lr`; returns the actor metrics.
pub(crate) fn update_actor(
    inputs: &UpdateInputs<'_>,
    recipe: &Recipe,
    optimizer: &mut AdamW,
    mut ema: Option<&mut Ema>,
    k: u64,
    lr: f64,
) -> Result<Metrics, TrainError> {
    let t = &recipe.trainer;
    let (engine, batch, old, reference, loss_kind, w) =
        (inputs.engine, inputs.batch, inputs.old, inputs.reference, inputs.loss, inputs.window);
    let (kept_idx, adv_values) = (inputs.rows, inputs.advantages);
    let device = kept_idx.device();
    let kept_rows = kept_idx.size()[0] as usize;
    let mut m = Metrics::new();
    let mut acc: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    let mini = t.ppo_mini_batch_size * recipe.rollout.n;
    let (mut grad_norms, mut skipped) = (vec![], 0.0);
    for epoch in 0..t.ppo_epochs {
        let mut order: Vec<usize> = (0..kept_rows).collect();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(recipe.seed ^ (k << 16) ^ epoch as u64));
        for mb in order.chunks(mini) {
            let micros: Vec<&[usize]> = mb.chunks(t.micro_batch_size).collect();
            let scale = 1.0 / (micros.len() as f64 * w as f64);
            for micro in &micros {
                let local =
                    Tensor::from_slice(&micro.iter().map(|&i| i as i64).collect::<Vec<_>>())
                        .to_device(device);
                let rows_idx = kept_idx.index_select(0, &local);
                for j in 0..w {
                    let out = engine.replay(batch, &rows_idx, j)?;
                    let old_lp = old.log_probs.index_select(0, &local).select(1, j);
                    let advantages = adv_values.index_select(0, &local).select(1, j);
                    let pick = |t: &Option<Tensor>| {
                        t.as_ref().map(|t| t.index_select(0, &local).select(1, j))
                    };
                    let (old_mean, old_std, old_dt) =
                        (pick(&old.means), pick(&old.std), pick(&old.sqrt_dt));
                    let pg = loss_kind.compute(
                        &PolicyBatch {
                            log_prob: &out.log_prob,
                            old_log_prob: &old_lp,
                            advantages: &advantages,
                            prev_sample_mean: Some(&out.prev_sample_mean),
                            old_prev_sample_mean: old_mean.as_ref(),
                            std_dev_t: old_std.as_ref().or(Some(&out.std_dev_t)),
                            sqrt_dt: old_dt.as_ref().or(Some(&out.sqrt_dt)),
                        },
                        &recipe.actor,
                    )?;
                    mean_into(&mut acc, &pg.metrics);
                    let mut loss = pg.loss;
                    if let Some(r) = reference {
                        let ref_mean = r
                            .means
                            .as_ref()
                            .expect("kept means")
                            .index_select(0, &local)
                            .select(1, j);
                        let kl = kl_to_reference(&out.prev_sample_mean, &ref_mean, &out.std_dev_t)?;
                        mean_into(&mut acc, &kl.metrics);
                        loss += kl.loss * recipe.actor.kl_loss_coef;
                    }
                    let total = loss.double_value(&[]);
                    if !total.is_finite() {
                        return Err(TrainError::Invalid(format!("step {k}: the loss is {total} (window step {j}); stopping before it reaches the weights")));
                    }
                    mean_into(&mut acc, &Metrics::from([("actor/loss".to_string(), total)]));
                    (loss * scale).backward();
                }
            }
            let norm = optimizer.clip_grad_norm(t.max_grad_norm);
            if norm.is_finite() {
                optimizer.step(lr);
                if let Some(ema) = ema.as_deref_mut() {
                    ema.update(&optimizer.params);
                }
                grad_norms.push(norm);
            } else {
                skipped += 1.0;
            }
            optimizer.zero_grad();
        }
    }
    m.extend(acc.into_iter().map(|(k, (s, c))| (k, s / c as f64)));
    let mean_norm = if grad_norms.is_empty() {
        f64::NAN
    } else {
        grad_norms.iter().sum::<f64>() / grad_norms.len() as f64
    };
    m.insert("actor/grad_norm".into(), mean_norm);
    m.insert("actor/skipped_steps".into(), skipped);
    Ok(m)
}
