//! A GARDO step (`docs/spec/algorithms.md` §5, "gardo"): the anchor reset, diversity-shaped
//! advantages, the uncertainty gate, the anchor's transition means, then the std-weighted clipped
//! update with the KL to the anchor on the gated rows. The rollout samples with the current policy.

use std::time::Instant;

use std::collections::BTreeMap;

use flowtune_config::{OldLogProb, Recipe};
use flowtune_objectives::gardo::{diversity_advantages, uncertainty, GateController};
use flowtune_objectives::losses::{gardo_loss, GardoBatch};
use flowtune_objectives::Metrics;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::diversity::DiversityFeatures;
use super::Algorithm;
use crate::collect::{collect, Collected};
use crate::logging::stats;
use crate::optim::Ema;
use crate::replay::replay_all;
use crate::run::Run;
use crate::source::Source;
use crate::update::{finite_loss, optimize, Batching, Learner, MetricMeans};
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

impl Algorithm for Gardo {
    fn needs_reference(&self, _: &Recipe) -> bool {
        false
    }

    fn start(&mut self, params: &BTreeMap<String, Tensor>, host: bool) {
        self.anchor = Some(Ema::new(0.0, params, host));
    }

    fn shadows(&self) -> Vec<(&'static str, &Ema)> {
        self.anchor.iter().map(|anchor| ("old", anchor)).collect()
    }

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

    fn step(
        &mut self,
        run: &Run<'_>,
        learner: &mut Learner,
        source: &mut Source,
        k: u64,
        lr: f64,
        m: &mut Metrics,
    ) -> Result<usize, TrainError> {
        if self.features.is_none() {
            let dir = run.recipe.actor.gardo_features.as_ref().ok_or_else(|| {
                TrainError::Invalid("actor.gardo_features: gardo needs a CLIP model".into())
            })?;
            self.features = Some(DiversityFeatures::load(dir, run.comm.device())?);
        }
        let c = collect(run, super::prompts(source)?, k, m)?;
        run.status("update");
        self.update(run, learner, &c, k, lr, m)?;
        Ok(c.batch.images.len())
    }
}

/// What GARDO carries from step to step (saved in checkpoints).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
struct GardoState {
    pub gate: GateController,
    /// The training step after which the anchor was last set (0: the start).
    pub anchor_step: u64,
    /// The last step's KL exceeded `actor.gardo_kl_threshold`.
    pub reset_pending: bool,
}

impl Gardo {
    /// Training step `k` of GARDO on a collected rollout.
    fn update(
        &mut self,
        run: &Run<'_>,
        learner: &mut Learner,
        c: &Collected,
        k: u64,
        lr: f64,
        m: &mut Metrics,
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
        let batch = &c.batch;
        let w = batch.windows[0].len() as i64;
        let device = c.kept.device();

        // Anchor reset, before the step's forwards.
        let due = (k > 1 && state.reset_pending)
            || k.saturating_sub(1).saturating_sub(state.anchor_step) > actor.gardo_reset_interval;
        if due {
            anchor.decay = 0.0;
            anchor.update(&learner.optimizer.params);
            state.anchor_step = k - 1;
            state.reset_pending = false;
        }
        m.insert("actor/ref_reset".into(), f64::from(u8::from(due)));

        // old log-probs
        let timer = Instant::now();
        let rollout_lp = batch.trajectory.all_log_probs.index_select(0, &c.kept);
        let old_lp = match recipe.trainer.old_log_prob {
            OldLogProb::Recompute => {
                let old = replay_all(engine, model, batch, &c.kept, w, false)?.log_probs;
                let drift = comm.gather_rows(&(&old - &rollout_lp).abs())?;
                m.insert(
                    "rollout_corr/logprob_abs_diff_mean".into(),
                    drift.mean(Kind::Float).double_value(&[]),
                );
                m.insert("rollout_corr/logprob_abs_diff_max".into(), drift.max().double_value(&[]));
                old
            }
            OldLogProb::Bypass => rollout_lp,
        };
        m.insert("timing_s/old_log_prob".into(), timer.elapsed().as_secs_f64());

        // ref: the anchor's transition means
        let timer = Instant::now();
        let params = &learner.optimizer.params;
        let anchor_means = anchor
            .with_swapped(params, || replay_all(engine, model, batch, &c.kept, w, true))?
            .means
            .expect("means are kept");
        m.insert("timing_s/ref".into(), timer.elapsed().as_secs_f64());

        // adv: diversity-shaped advantages and the gate, over the whole step
        let timer = Instant::now();
        let kept = Vec::<i64>::try_from(c.kept.to_device(Device::Cpu))?;
        let images: Vec<_> = kept.iter().map(|&i| batch.images[i as usize].clone()).collect();
        let feats: Vec<Vec<Vec<f32>>> = comm.gather(&features.embed(&images)?)?;
        let rewards: Vec<f64> = c.rewards.iter().map(|&r| r as f64).collect();
        let adv = diversity_advantages(&rewards, &c.uids, &feats.concat())?;
        stats("critic/advantages", &adv.values, m);
        m.insert(
            "critic/diversity/mean".into(),
            adv.distances.iter().sum::<f64>() / adv.distances.len() as f64,
        );
        let proxies = proxy_scores(c, &actor.gardo_proxy_rewards)?;
        let gate = state.gate.gate(&uncertainty(&rewards, &proxies));
        m.insert("actor/kl_perc".into(), state.gate.share);
        let gated = gate.iter().filter(|&&g| g).count() as f64 / gate.len() as f64;
        m.insert("actor/gated_fraction".into(), gated);
        let mine = c.owned.clone();
        let advantages: Vec<f32> = adv.values[mine.clone()].iter().map(|&a| a as f32).collect();
        let advantages = Tensor::from_slice(&advantages).to_device(device);
        let gate = Tensor::from_slice(&gate[mine]).to_device(device);
        m.insert("timing_s/adv".into(), timer.elapsed().as_secs_f64());

        // update
        let update = crate::perf::ActorUpdate::start();
        let batching = Batching::groups(recipe, c.rewards.len(), c.owned.clone());
        let result = optimize(learner, run, batching, k, lr, |micro, scale, backward| {
            let local: Vec<i64> = micro.iter().map(|&i| (i - c.owned.start) as i64).collect();
            let local = Tensor::from_slice(&local).to_device(device);
            let rows = c.kept.index_select(0, &local);
            let mut means = MetricMeans::default();
            for j in 0..w {
                let out = engine.replay(batch, &rows, j)?;
                let at = |t: &Tensor| t.index_select(0, &local).select(1, j);
                let loss = gardo_loss(
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
                let total = finite_loss(&loss.loss, k, &format!("window step {j}"))?;
                means.add(&loss.metrics);
                means.add(&Metrics::from([("actor/loss".to_string(), total)]));
                backward.run(&(loss.loss * (scale / w as f64)))?;
            }
            Ok(means.means())
        });
        let result = result?;
        if result.get("actor/kl_loss").is_some_and(|&kl| kl > actor.gardo_kl_threshold) {
            state.reset_pending = true;
        }
        m.extend(result);
        update.finish(m);
        Ok(())
    }
}

/// Each proxy reward's scores of the step's rows.
fn proxy_scores(c: &Collected, names: &[String]) -> Result<Vec<Vec<f64>>, TrainError> {
    names
        .iter()
        .map(|name| {
            c.details
                .iter()
                .map(|d| {
                    d.by_scorer.get(name).copied().ok_or_else(|| {
                        TrainError::Invalid(format!(
                            "actor.gardo_proxy_rewards: `{name}` gave no score for a sample"
                        ))
                    })
                })
                .collect()
        })
        .collect()
}
