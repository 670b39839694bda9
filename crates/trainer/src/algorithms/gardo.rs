//! A GARDO step (`docs/spec/algorithms.md` §5, "gardo"): the anchor reset, diversity-shaped
//! advantages, the uncertainty gate, the anchor's transition means, then the std-weighted clipped
//! update with the KL to the anchor on the gated rows. The rollout samples with the current policy.

use std::time::Instant;

use std::collections::BTreeMap;

use flowtune_config::OldLogProb;
use flowtune_objectives::gardo::{diversity_advantages, uncertainty, GateController};
use flowtune_objectives::losses::{gardo_loss, GardoBatch};
use flowtune_sampling::upload;
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use super::diversity::DiversityFeatures;
use super::Algorithm;
use crate::collect::{collect, Collected};
use crate::logging::stats;
use crate::optim::Ema;
use crate::replay::replay_all;
use crate::run::Run;
use crate::source::Source;
use crate::stateful::Stateful;
use crate::step::Step;
use crate::update::{optimize, Batching, Learner, SlotLoss};
use crate::TrainError;

/// GARDO: Flow-GRPO's rollout and ratio, diversity-shaped advantages and a gated KL to an anchor
/// copy of the weights that is reset when it falls behind.
#[derive(Default)]
pub(crate) struct Gardo {
    /// The diversity model, loaded at the first step.
    features: Option<DiversityFeatures>,
    /// The anchor: a copy of the trained weights, saved as the `old` shadow.
    anchor: Option<Ema>,
    state: GardoState,
}

/// The gate and the anchor's age (its copy of the weights is a shadow).
impl Stateful for Gardo {
    fn state(&self) -> serde_json::Value {
        serde_json::to_value(&self.state).expect("GARDO's state is JSON")
    }

    fn restore(&mut self, state: &serde_json::Value) -> Result<(), TrainError> {
        if !state.is_null() {
            self.state = serde_json::from_value(state.clone()).map_err(|e| {
                TrainError::Invalid(format!("a checkpoint's GARDO state does not read: {e}"))
            })?;
        }
        Ok(())
    }
}

impl Algorithm for Gardo {
    fn start(&mut self, params: &BTreeMap<String, Tensor>, host: bool) {
        self.anchor = Some(Ema::new("old", 0.0, params, host));
    }

    fn shadows(&self) -> Vec<&Ema> {
        self.anchor.iter().collect()
    }

    fn step(
        &mut self,
        run: &Run<'_>,
        learner: &mut Learner,
        source: &mut Source,
        step: &mut Step,
    ) -> Result<usize, TrainError> {
        if self.features.is_none() {
            let dir = run.recipe.actor.gardo.features.as_ref().ok_or_else(|| {
                TrainError::Invalid("actor.gardo.features: gardo needs a CLIP model".into())
            })?;
            self.features = Some(DiversityFeatures::load(dir, run.comm.device())?);
        }
        let collected = collect(run, super::prompts(source)?, step)?;
        run.status("update");
        self.update(run, learner, &collected, step)?;
        Ok(collected.batch.images.len())
    }
}

/// What GARDO carries from step to step (saved in checkpoints).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
struct GardoState {
    pub gate: GateController,
    /// The training step after which the anchor was last set (0: the start).
    pub anchor_step: u64,
    /// The last step's KL exceeded `actor.gardo.kl_threshold`.
    pub reset_pending: bool,
}

impl Gardo {
    /// Training step `step` of GARDO on a collected rollout.
    fn update(
        &mut self,
        run: &Run<'_>,
        learner: &mut Learner,
        collected: &Collected,
        step: &mut Step,
    ) -> Result<(), TrainError> {
        let (Some(features), Some(anchor)) = (&self.features, &mut self.anchor) else {
            return Err(TrainError::Invalid(
                "gardo: its features and anchor are made when training starts".into(),
            ));
        };
        let state = &mut self.state;
        let (recipe, engine, comm) = (run.recipe, &run.engine, &run.comm);
        let actor = &recipe.actor;
        let model = engine.pipe.denoiser();
        let batch = &collected.batch;
        let kept = &collected.kept;
        let window = batch.windows[0].len() as i64;
        let device = kept.device.device();

        // Anchor reset, before the step's forwards.
        let due = (step.number > 1 && state.reset_pending)
            || step.number.saturating_sub(1).saturating_sub(state.anchor_step)
                > actor.gardo.reset_interval;
        if due {
            anchor.decay = 0.0;
            anchor.update(&learner.optimizer.params);
            state.anchor_step = step.number - 1;
            state.reset_pending = false;
        }
        step.metrics.insert("actor/ref_reset".into(), f64::from(u8::from(due)));

        // old log-probs
        let timer = Instant::now();
        let rollout_lp = batch.trajectory.all_log_probs.index_select(0, &kept.device);
        let old_lp = match recipe.trainer.old_log_prob {
            OldLogProb::Recompute => {
                let old = replay_all(engine, model, batch, kept, window, false)?.log_probs;
                let drift = comm.gather_rows(&(&old - &rollout_lp).abs())?;
                step.metrics.insert(
                    "rollout_corr/logprob_abs_diff_mean".into(),
                    drift.mean(Kind::Float).double_value(&[]),
                );
                step.metrics.insert(
                    "rollout_corr/logprob_abs_diff_max".into(),
                    drift.max().double_value(&[]),
                );
                old
            }
            OldLogProb::Bypass => rollout_lp,
        };
        step.timers.add("old_log_prob", timer.elapsed().as_secs_f64());

        // ref: the anchor's transition means
        let params = &learner.optimizer.params;
        let anchor_means = step
            .timers
            .time("ref", || {
                anchor.with_swapped(params, || replay_all(engine, model, batch, kept, window, true))
            })?
            .means
            .expect("means are kept");

        // adv: diversity-shaped advantages and the gate, over the whole step
        let timer = Instant::now();
        let kept_rows = &kept.host;
        let images: Vec<_> =
            kept_rows.iter().map(|&row| batch.images[row as usize].clone()).collect();
        let feats: Vec<Vec<Vec<f32>>> = comm.gather(&features.embed(&images)?)?;
        let rewards: Vec<f64> = collected.rewards.iter().map(|&reward| reward as f64).collect();
        let adv = diversity_advantages(&rewards, &collected.uids, &feats.concat())?;
        stats("critic/advantages", &adv.values, &mut step.metrics);
        step.metrics.insert(
            "critic/diversity/mean".into(),
            adv.distances.iter().sum::<f64>() / adv.distances.len() as f64,
        );
        let proxies = proxy_scores(collected, &actor.gardo.proxy_rewards)?;
        let gate = state.gate.gate(&uncertainty(&rewards, &proxies));
        step.metrics.insert("actor/kl_perc".into(), state.gate.share);
        let gated = gate.iter().filter(|&&gated| gated).count() as f64 / gate.len() as f64;
        step.metrics.insert("actor/gated_fraction".into(), gated);
        let mine = collected.owned.clone();
        let advantages: Vec<f32> =
            adv.values[mine.clone()].iter().map(|&advantage| advantage as f32).collect();
        let advantages = Tensor::from_slice(&advantages).to_device(device);
        let gate = Tensor::from_slice(&gate[mine]).to_device(device);
        step.timers.add("adv", timer.elapsed().as_secs_f64());

        // update
        let update = crate::perf::ActorUpdate::start();
        let batching = Batching::groups(recipe, collected.rewards.len(), collected.owned.clone());
        let result = optimize(learner, run, batching, step.number, step.lr, |micro, pass| {
            let first = collected.owned.start;
            let local: Vec<i64> = micro.iter().map(|&row| (row - first) as i64).collect();
            let rows = kept.select(&local);
            let local = upload(Tensor::from_slice(&local), device);
            pass.slots(window as usize, |slot| {
                let slot = slot as i64;
                let out = engine.replay(batch, &rows, slot)?;
                let at = |steps: &Tensor| steps.index_select(0, &local).select(1, slot);
                let output = gardo_loss(
                    &GardoBatch {
                        log_prob: &out.log_prob,
                        old_log_prob: &at(&old_lp),
                        advantages: &advantages.index_select(0, &local),
                        std_dev_t: &out.std_dev_t,
                        prev_sample_mean: &out.prev_sample_mean,
                        anchor_prev_sample_mean: &at(&anchor_means),
                        gate: &gate.index_select(0, &local),
                    },
                    actor,
                )?;
                Ok(SlotLoss { what: format!("window step {slot}"), output })
            })
        });
        let result = result?;
        if result.get("actor/kl_loss").is_some_and(|&kl| kl > actor.gardo.kl_threshold) {
            state.reset_pending = true;
        }
        step.metrics.extend(result);
        update.finish(&mut step.metrics);
        Ok(())
    }
}

/// Each proxy reward's scores of the step's rows.
fn proxy_scores(collected: &Collected, names: &[String]) -> Result<Vec<Vec<f64>>, TrainError> {
    names
        .iter()
        .map(|name| {
            collected
                .details
                .iter()
                .map(|detail| {
                    detail.by_scorer.get(name).copied().ok_or_else(|| {
                        TrainError::Invalid(format!(
                            "actor.gardo.proxy_rewards: `{name}` gave no score for a sample"
                        ))
                    })
                })
                .collect()
        })
        .collect()
}
