//! DMD2 (`docs/spec/algorithms.md` §9), as VeRL-Omni runs it: three roles on one base model — the
//! few-step student (the trained adapter, with the loop's EMA as `student_ema`), the fake score
//! (a second adapter with its own optimizer) and the teacher (the base, adapters off, with CFG).
//! A step is one student update on fresh prompts, then `fake_update_ratio` fake-score updates,
//! each on fresh prompts. The fake score's weights live in the model's adapter tensors only while
//! it runs: they are swapped in for its forwards and its updates, and swapped out after.

mod pictures;
mod student;

use std::collections::BTreeMap;

use flowtune_config::Recipe;
use flowtune_models::{velocity_at_sigma, FlowPipeline, PipelineOptions};
use flowtune_objectives::losses::{
    dmd_gradient, dmd_loss, fake_score_loss, teacher_guidance, CfgNorm, Dmd2Config,
};
use flowtune_objectives::Metrics;
use flowtune_sampling::{upload, SigmaGrid};
use tch::Tensor;

use super::Algorithm;
use crate::optim::{AdamW, Ema};
use crate::run::Run;
use crate::source::Source;
use crate::stateful::{Scope, Stateful};
use crate::step::Step;
use crate::update::{optimize, Batching, Learner, MetricMeans, SlotLoss};
use crate::TrainError;
use student::Attempt;

/// Where the fake score's Adam state is saved.
const CRITIC: &str = "fake_score_optim";

/// DMD2's state: its settings, the student's grid and the fake score.
#[derive(Default)]
pub(crate) struct Dmd2 {
    config: Dmd2Config,
    sigmas: Vec<f32>,
    /// AdamW's betas and ε (the trainer's).
    adam: ([f64; 2], f64),
    /// The fake score's adapter weights while the student's are in the model.
    fake: Option<Ema>,
    /// The fake score's optimizer, over the model's adapter tensors (used while the fake score's
    /// weights are in them).
    critic: Option<Learner>,
}

impl Algorithm for Dmd2 {
    fn load(
        &mut self,
        recipe: &Recipe,
        _options: &PipelineOptions,
        pipe: &dyn FlowPipeline,
    ) -> Result<(), TrainError> {
        let config = &recipe.actor.dmd2;
        let trained = pipe.scheduler().num_train_timesteps as usize;
        if ![0, trained].contains(&config.score_discrete_steps) {
            return Err(TrainError::Invalid(format!(
                "actor.dmd2.score_discrete_steps: {} differs from the scheduler's {trained} training timesteps; set {trained} (or 0 for continuous noise levels)",
                config.score_discrete_steps
            )));
        }
        self.config = config.clone();
        self.sigmas = config.student_sigmas();
        self.adam = (recipe.trainer.betas, recipe.trainer.eps);
        Ok(())
    }

    /// The fake score starts as a copy of the student (both the base model at first).
    fn start(&mut self, params: &BTreeMap<String, Tensor>, host: bool) {
        self.fake = Some(Ema::new("fake_score", 0.0, params, host));
        let shared = params.iter().map(|(n, p)| (n.clone(), p.shallow_clone())).collect();
        let (betas, eps) = self.adam;
        let optimizer = AdamW::new(shared, betas, eps, self.config.fake_weight_decay, host);
        self.critic = Some(Learner { optimizer, ema: None, lagged: None });
    }

    fn shadows(&self) -> Vec<&Ema> {
        self.fake.iter().collect()
    }

    fn sampling_grid(&self) -> Option<SigmaGrid> {
        let timesteps = self.sigmas[..self.sigmas.len() - 1].iter().map(|s| s * 1000.0).collect();
        Some(SigmaGrid { sigmas: self.sigmas.clone(), timesteps, mu: None })
    }

    fn step(
        &mut self,
        run: &Run<'_>,
        learner: &mut Learner,
        source: &mut Source,
        step: &mut Step,
    ) -> Result<usize, TrainError> {
        let loader = super::prompts(source)?;
        let steps = self.sigmas.len() - 1;
        run.status("student");
        let attempt = Attempt::draw(run, loader, (step.number, 0), steps, true)?;
        let mut samples = attempt.rows;
        let grid = self.sampling_grid().expect("a student grid");
        pictures::show(run, &attempt, grid, step)?;
        self.student_update(run, learner, &attempt, step)?;
        let mut fake = MetricMeans::default();
        for index in 1..=self.config.fake_update_ratio as u64 {
            run.status("fake score");
            let attempt = Attempt::draw(run, loader, (step.number, index), steps, false)?;
            samples += attempt.rows;
            fake.add(&self.fake_update(run, learner, &attempt, step)?);
        }
        step.metrics.extend(fake.means());
        Ok(samples)
    }
}

impl Dmd2 {
    /// The student's update: its samples re-noised and scored by the teacher (guided) and the
    /// fake score, the distribution-matching gradient back through its exit forward.
    fn student_update(
        &mut self,
        run: &Run<'_>,
        learner: &mut Learner,
        attempt: &Attempt,
        step: &mut Step,
    ) -> Result<(), TrainError> {
        let (config, sigmas) = (&self.config, &self.sigmas);
        let fake = self.fake.as_mut().expect("started");
        let model = run.engine.pipe.denoiser();
        let reference = run.reference.as_ref().expect("dmd2 always has a reference");
        let negative = attempt.negative.as_ref().expect("the student's attempt is guided");
        let params = shared(learner);
        let number = step.number;
        let batching = Batching::groups(run.recipe, attempt.rows, attempt.local.clone());
        let batching = Batching { mini: attempt.rows, ..batching };
        let update = crate::perf::ActorUpdate::start();
        let result = optimize(learner, run, batching, number, step.lr, |micro, pass| {
            let local: Vec<i64> = micro.iter().map(|&r| (r - attempt.local.start) as i64).collect();
            let (text, negative) = (attempt.text.rows_at(&local), negative.rows_at(&local));
            let x = attempt.simulate(run, micro, &text, sigmas, number)?;
            let x0 = tch::no_grad(|| attempt.predict(model, &x, &text, sigmas))?;
            let (sigma, _, noised) = attempt.score_inputs(run, micro, &text, &x0, config, number);
            let clean = |v: Tensor| &noised - flowtune_sampling::per_row(&sigma, &noised) * v;
            let real = tch::no_grad(|| {
                reference.run(model, |net| -> Result<Tensor, TrainError> {
                    let cond = velocity_at_sigma(net, &noised, &sigma, &text)?;
                    let uncond = velocity_at_sigma(net, &noised, &sigma, &negative)?;
                    let scale = config.teacher_guidance_scale;
                    Ok(match config.cfg_norm {
                        CfgNorm::None => {
                            teacher_guidance(&cond, &uncond, scale, CfgNorm::None, &[])
                        }
                        CfgNorm::LayerNorm => net.norm_rescaled_guidance(&cond, &uncond, scale),
                    })
                })
            })?;
            let fake_v = tch::no_grad(|| {
                fake.with_swapped(&params, || velocity_at_sigma(model, &noised, &sigma, &text))
            })?;
            let (g, normalizer, nonfinite) =
                dmd_gradient(&clean(fake_v), &clean(real), &x0, config.normalization_epsilon)?;
            pass.slots(1, |_| {
                let student = attempt.predict(model, &x, &text, sigmas)?;
                let mut output = dmd_loss(&student, &g, &normalizer, nonfinite)?;
                output.metrics.insert("dmd/rollout_exit".into(), attempt.exit as f64);
                Ok(SlotLoss { what: "the student's DMD loss".into(), output })
            })
        });
        step.metrics.extend(result?);
        update.finish(&mut step.metrics);
        Ok(())
    }

    /// One fake-score update: the student's samples (no gradient) re-noised, the fake score's
    /// velocity regressed on the flow target, its weights swapped in for the update. Returns its
    /// metrics (`fake_score/*`).
    fn fake_update(
        &mut self,
        run: &Run<'_>,
        learner: &mut Learner,
        attempt: &Attempt,
        step: &mut Step,
    ) -> Result<Metrics, TrainError> {
        let (config, sigmas, number) = (&self.config, &self.sigmas, step.number);
        let model = run.engine.pipe.denoiser();
        let rows: Vec<usize> = attempt.local.clone().collect();
        // The student's samples first, in micro-batches as the update takes them.
        let micro = run.recipe.trainer.micro_batch_size.max(1);
        let mut x0 = vec![];
        step.timers.time("gen", || -> Result<(), TrainError> {
            for chunk in rows.chunks(micro) {
                let local: Vec<i64> =
                    chunk.iter().map(|&r| (r - attempt.local.start) as i64).collect();
                let text = attempt.text.rows_at(&local);
                let x = attempt.simulate(run, chunk, &text, sigmas, number)?;
                x0.push(tch::no_grad(|| attempt.predict(model, &x, &text, sigmas))?);
            }
            Ok(())
        })?;
        let x0 = Tensor::cat(&x0, 0);
        let device = x0.device();
        let params = shared(learner);
        let fake = self.fake.as_mut().expect("started");
        let critic = self.critic.as_mut().expect("started");
        let batching = Batching::groups(run.recipe, attempt.rows, attempt.local.clone());
        let batching = Batching { mini: attempt.rows, ..batching };
        fake.swap(&params);
        let result = optimize(critic, run, batching, number, config.fake_lr, |micro, pass| {
            let local: Vec<i64> = micro.iter().map(|&r| (r - attempt.local.start) as i64).collect();
            let text = attempt.text.rows_at(&local);
            let x0 = x0.index_select(0, &upload(Tensor::from_slice(&local), device));
            let (sigma, noise, noised) =
                attempt.score_inputs(run, micro, &text, &x0, config, number);
            pass.slots(1, |_| {
                let velocity = velocity_at_sigma(model, &noised, &sigma, &text)?;
                let mut output = fake_score_loss(&velocity, &noise, &x0)?;
                output.metrics.insert("dmd/rollout_exit".into(), attempt.exit as f64);
                Ok(SlotLoss { what: "the fake score's loss".into(), output })
            })
        });
        fake.swap(&params);
        let metrics = result?.into_iter().filter_map(|(key, value)| {
            let renamed = match key.as_str() {
                "actor/loss" => return None,
                "dmd/rollout_exit" => "fake_score/rollout_exit".to_string(),
                other => other.replace("actor/", "fake_score/"),
            };
            Some((renamed, value))
        });
        Ok(metrics.collect())
    }
}

/// The model's adapter tensors (the student's weights, or the fake score's while swapped in).
fn shared(learner: &Learner) -> BTreeMap<String, Tensor> {
    learner.optimizer.params.iter().map(|(n, p)| (n.clone(), p.shallow_clone())).collect()
}

/// The fake score's Adam update count (`state.json`) and moments (`fake_score_optim.*`); its
/// weights are a shadow ([`Algorithm::shadows`]).
impl Stateful for Dmd2 {
    fn state(&self) -> serde_json::Value {
        let updates = self.critic.as_ref().map(|c| c.optimizer.state());
        serde_json::json!({ "fake_score_updates": updates })
    }

    fn restore(&mut self, state: &serde_json::Value) -> Result<(), TrainError> {
        match self.critic.as_mut() {
            Some(critic) => critic.optimizer.restore(&state["fake_score_updates"]),
            None => Ok(()),
        }
    }

    fn state_tensors(&self, scope: &Scope<'_>) -> Vec<(String, Tensor)> {
        let Some(critic) = &self.critic else { return vec![] };
        let named = critic.optimizer.state_tensors(scope).into_iter();
        named.map(|(n, t)| (format!("{CRITIC}.{n}"), t)).collect()
    }

    fn load_state_tensors(
        &self,
        saved: &BTreeMap<String, Tensor>,
        scope: &Scope<'_>,
    ) -> Result<(), String> {
        let Some(critic) = &self.critic else { return Ok(()) };
        let prefix = format!("{CRITIC}.");
        let mine = saved
            .iter()
            .filter_map(|(n, t)| Some((n.strip_prefix(&prefix)?.to_string(), t.shallow_clone())))
            .collect();
        critic.optimizer.load_state_tensors(&mine, scope)
    }
}
