//! The second half of a policy-gradient step (flow_grpo, dance_grpo, mix_grpo, grpo_guard,
//! flow_dppo) and of on-policy distillation (diffusion_opd): old log-probs (recomputed or the
//! rollout's), reference means for the KL term, the teachers' means for the distillation KL, group
//! advantages, rollout correction, then the update over every trained window step.

use std::time::Instant;

use flowtune_config::{OldLogProb, Recipe};
use flowtune_models::{FlowPipeline, PipelineOptions};
use flowtune_objectives::losses::{
    distill_kl, kl_to_reference, LossOutput, PolicyBatch, PolicyLoss,
};
use flowtune_objectives::{Correction, Metrics};
use flowtune_rollout::{Engine, RolloutBatch, Rows};
use flowtune_sampling::upload;
use tch::{Kind, Tensor};

use super::teachers::{Teacher, TeacherMeans};
use super::Algorithm;
use crate::collect::{collect_behaviour, Collected};
use crate::replay::{replay_all, OldPolicy};
use crate::run::Run;
use crate::source::Source;
use crate::stateful::Stateful;
use crate::step::Step;
use crate::update::{optimize, Batching, Learner, MicroPass, SlotLoss};
use crate::TrainError;

/// Flow-GRPO and its family: SDE rollouts, group advantages, a clipped step-ratio loss; with no
/// loss, DiffusionOPD's distillation alone. It owns the frozen teachers of distillation.
pub(crate) struct PolicyGradient {
    loss: Option<PolicyLoss>,
    teachers: Vec<Teacher>,
}

impl PolicyGradient {
    pub fn new(loss: Option<PolicyLoss>) -> Self {
        Self { loss, teachers: vec![] }
    }
}

/// Nothing carries over from step to step.
impl Stateful for PolicyGradient {}

impl Algorithm for PolicyGradient {
    fn load(
        &mut self,
        recipe: &Recipe,
        options: &PipelineOptions,
        pipe: &dyn FlowPipeline,
    ) -> Result<(), TrainError> {
        self.teachers = super::teachers::load(recipe, options, pipe)?;
        Ok(())
    }

    fn step(
        &mut self,
        run: &Run<'_>,
        learner: &mut Learner,
        source: &mut Source,
        step: &mut Step,
    ) -> Result<usize, TrainError> {
        let collected = collect_behaviour(run, learner, super::prompts(source)?, step)?;
        run.status("update");
        self.update(run, learner, &collected, step)?;
        Ok(collected.batch.images.len())
    }
}

impl PolicyGradient {
    /// Old log-probs, reference, teachers, advantages and the update of training step `step`;
    /// without a policy loss (`diffusion_opd`) the update minimises the distillation KL alone.
    fn update(
        &self,
        run: &Run<'_>,
        learner: &mut Learner,
        collected: &Collected,
        step: &mut Step,
    ) -> Result<(), TrainError> {
        let (loss_kind, teachers) = (self.loss, &self.teachers);
        let (recipe, engine, comm) = (run.recipe, &run.engine, &run.comm);
        let model = engine.pipe.denoiser();
        let batch = &collected.batch;
        let kept = &collected.kept;
        let window = batch.windows[0].len() as i64;
        let rollout_lp = batch.trajectory.all_log_probs.index_select(0, &kept.device);

        // old log-probs
        let timer = Instant::now();
        let old = match recipe.trainer.old_log_prob {
            OldLogProb::Recompute => {
                let means = loss_kind.is_some_and(PolicyLoss::needs_means);
                let old = replay_all(engine, model, batch, kept, window, means)?;
                let drift = comm.gather_rows(&(&old.log_probs - &rollout_lp).abs())?;
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
            OldLogProb::Bypass => OldPolicy {
                log_probs: rollout_lp.shallow_clone(),
                means: None,
                std: None,
                sqrt_dt: None,
            },
        };
        let correction = if recipe.rollout_correction.enabled() {
            // Over the whole step's rows, then this rank's.
            let (all_old, all_rollout) =
                (comm.gather_rows(&old.log_probs)?, comm.gather_rows(&rollout_lp)?);
            let all = recipe.rollout_correction.compute(&all_old, &all_rollout)?;
            step.metrics.extend(all.metrics.clone());
            let owned = &collected.owned;
            let mine = |rows: &Tensor| rows.narrow(0, owned.start as i64, owned.len() as i64);
            Some(Correction {
                weights: mine(&all.weights),
                keep: mine(&all.keep),
                metrics: all.metrics,
            })
        } else {
            None
        };
        step.timers.add("old_log_prob", timer.elapsed().as_secs_f64());

        // ref
        let reference = step.timers.time("ref", || match &run.reference {
            Some(reference) if recipe.actor.use_kl_loss => reference
                .run(model, |net| replay_all(engine, net, batch, kept, window, true))
                .map(Some),
            _ => Ok(None),
        })?;

        // teacher
        let distils = loss_kind.is_none() || recipe.actor.use_distill_loss;
        let teacher = step.timers.time("teacher", || {
            if !distils {
                return Ok(None);
            }
            let sources = &collected.sources[collected.owned.clone()];
            super::teachers::teacher_means(teachers, engine, batch, kept, sources, window).map(Some)
        })?;

        // adv
        let advantages = step.timers.time("adv", || {
            collected.advantages(window as usize, &recipe.advantage, &mut step.metrics)
        })?;

        // update
        let update = crate::perf::ActorUpdate::start();
        let inputs = Inputs {
            engine,
            batch,
            rows: kept,
            old: &old,
            reference: reference.as_ref(),
            teacher: teacher.as_ref(),
            correction: correction.as_ref(),
            advantages: &advantages,
            loss: loss_kind,
            window,
            first: collected.owned.start,
        };
        let batching = Batching::groups(recipe, collected.rewards.len(), collected.owned.clone());
        step.metrics.extend(optimize(
            learner,
            run,
            batching,
            step.number,
            step.lr,
            |micro, pass| inputs.micro_step(run, micro, pass),
        )?);
        update.finish(&mut step.metrics);
        Ok(())
    }
}

/// What the update reads.
struct Inputs<'a> {
    engine: &'a Engine<'a>,
    batch: &'a RolloutBatch,
    /// Batch rows that train (those with a reward).
    rows: &'a Rows,
    old: &'a OldPolicy,
    reference: Option<&'a OldPolicy>,
    teacher: Option<&'a TeacherMeans>,
    correction: Option<&'a Correction>,
    /// (kept rows, W)
    advantages: &'a Tensor,
    /// None: distillation alone.
    loss: Option<PolicyLoss>,
    window: i64,
    /// The step-wide position of this rank's first kept row.
    first: usize,
}

impl Inputs<'_> {
    /// The losses of one micro-batch (step-wide positions of this rank's kept rows), window step
    /// by window step.
    fn micro_step(
        &self,
        run: &Run<'_>,
        micro: &[usize],
        pass: &mut MicroPass,
    ) -> Result<(), TrainError> {
        let recipe = run.recipe;
        let local = micro.iter().map(|&row| (row - self.first) as i64).collect::<Vec<_>>();
        let rows = self.rows.select(&local);
        let device = rows.device.device();
        let local = upload(Tensor::from_slice(&local), device);
        let at = |steps: &Tensor, slot: i64| steps.index_select(0, &local).select(1, slot);
        pass.slots(self.window as usize, |slot| {
            let slot = slot as i64;
            let out = self.engine.replay(self.batch, &rows, slot)?;
            let pick = |steps: &Option<Tensor>| steps.as_ref().map(|steps| at(steps, slot));
            let (old_mean, old_std, old_dt) =
                (pick(&self.old.means), pick(&self.old.std), pick(&self.old.sqrt_dt));
            let weights = self.correction.map(|correction| at(&correction.weights, slot));
            let keep = self.correction.map(|correction| at(&correction.keep, slot));
            let mut loss = Tensor::zeros([], (Kind::Float, device));
            // The policy loss's, the distillation KL's and the reference KL's keys are distinct.
            let mut metrics = Metrics::new();
            if let Some(kind) = self.loss {
                let pg = kind.compute(
                    &PolicyBatch {
                        log_prob: &out.log_prob,
                        old_log_prob: &at(&self.old.log_probs, slot),
                        advantages: &at(self.advantages, slot),
                        prev_sample_mean: Some(&out.prev_sample_mean),
                        old_prev_sample_mean: old_mean.as_ref(),
                        std_dev_t: old_std.as_ref().or(Some(&out.std_dev_t)),
                        sqrt_dt: old_dt.as_ref().or(Some(&out.sqrt_dt)),
                        weights: weights.as_ref(),
                        keep: keep.as_ref(),
                    },
                    &recipe.actor,
                )?;
                metrics.extend(pg.metrics);
                loss = pg.loss;
            }
            if let Some(teacher) = self.teacher {
                let teacher_mean = at(&teacher.means, slot);
                let weights = teacher.weights.index_select(0, &local);
                let kl = distill_kl(
                    &out.prev_sample_mean,
                    &teacher_mean,
                    &out.std_dev_t,
                    Some(&weights),
                )?;
                metrics.extend(kl.metrics);
                let coef = if self.loss.is_some() { recipe.actor.distill_loss_coef } else { 1.0 };
                loss += kl.loss * coef;
            }
            if let Some(reference) = self.reference {
                let ref_mean =
                    at(reference.means.as_ref().expect("reference means are kept"), slot);
                let kl = kl_to_reference(&out.prev_sample_mean, &ref_mean, &out.std_dev_t)?;
                metrics.extend(kl.metrics);
                loss += kl.loss * recipe.actor.kl_loss_coef;
            }
            Ok(SlotLoss {
                what: format!("window step {slot}"),
                output: LossOutput { loss, metrics },
            })
        })
    }
}
