//! The first half of an online step: a step's prompts sampled `n` times and scored, with the
//! reward metrics, the periodic grid of training images, and the rows a reward failure dropped.
//! Under data parallelism each rank samples and scores its share of the prompt groups (each row
//! still seeded by its place in the whole step), and the scores are gathered, so rewards and
//! advantages are those of the whole step on every rank.

use std::ops::Range;
use std::path::Path;
use std::time::Instant;

use flowtune_data::{PromptLoader, PromptRecord, Row};
use flowtune_objectives::Metrics;
use flowtune_rewards::{SampleScores, ScoredBatch};
use flowtune_rollout::{RolloutBatch, Rows};
use tch::Tensor;

use crate::logging::stats;
use crate::run::Run;
use crate::scoring::{rollout_and_score, Scored};
use crate::step::Step;
use crate::update::Learner;
use crate::TrainError;

/// A scored rollout, restricted to the rows that have a reward.
pub(crate) struct Collected {
    /// This rank's rows.
    pub batch: RolloutBatch,
    /// This rank's batch rows with a reward.
    pub kept: Rows,
    /// The rewards and group ids (one uid per prompt) of the whole step's rows with a reward.
    pub rewards: Vec<f32>,
    pub uids: Vec<String>,
    /// What each scorer gave those rows.
    pub details: Vec<SampleScores>,
    /// Their prompts' `data_source`.
    pub sources: Vec<String>,
    /// Which of those (positions into `rewards`) are this rank's `kept` rows, in order.
    pub owned: Range<usize>,
}

impl Collected {
    /// Group advantages over the whole step, broadcast over `steps` trained steps; logs
    /// `critic/rewards/zero_std_ratio` and `critic/advantages/*`. Returns this rank's kept rows,
    /// (rows, steps) on the model's device.
    pub fn advantages(
        &self,
        steps: usize,
        config: &flowtune_objectives::AdvantageConfig,
        metrics: &mut Metrics,
    ) -> Result<Tensor, TrainError> {
        let uids: Vec<&str> = self.uids.iter().map(String::as_str).collect();
        let adv = flowtune_objectives::group_advantages(&self.rewards, &uids, steps, config)?;
        metrics.insert("critic/rewards/zero_std_ratio".into(), adv.zero_std_ratio);
        let first: Vec<f64> =
            Vec::<f32>::try_from(adv.values.select(1, 0))?.into_iter().map(f64::from).collect();
        stats("critic/advantages", &first, metrics);
        let owned = adv.values.narrow(0, self.owned.start as i64, self.owned.len() as i64);
        Ok(owned.to_device(self.kept.device.device()))
    }
}

/// Samples and scores the prompts of `step` with the behaviour policy: the trained weights, or
/// under `trainer.off_policy_lag: 1` the copy one update behind them ([`Learner::lagged`]), which
/// then takes the trained weights, those this step's update starts from. The samples of step k
/// are so drawn with the weights after step k − 2, as a rollout that runs beside step k − 1's
/// update draws them. In a job split into rollout and training ranks, the rollout ranks sample
/// and hand the samples over ([`crate::split`]). Logs `async/staleness`, the updates between the
/// two.
pub(crate) fn collect_behaviour(
    run: &Run<'_>,
    learner: &mut Learner,
    loader: &mut PromptLoader,
    step: &mut Step,
) -> Result<Collected, TrainError> {
    let lag = run.recipe.trainer.off_policy_lag;
    let collected = if run.comm.handoff().is_some() {
        crate::split::collect_handed(run, learner, loader, step)?
    } else if let Some(lagged) = learner.lagged.as_mut() {
        let params = &learner.optimizer.params;
        let collected = lagged.with_swapped(params, || collect(run, loader, step))?;
        lagged.update(params);
        collected
    } else {
        collect(run, loader, step)?
    };
    let staleness = (step.number - 1).min(lag);
    step.metrics.insert("async/staleness".into(), staleness as f64);
    Ok(collected)
}

/// Samples and scores the prompts of `step`; times `gen` and `reward`, logs
/// `perf/tflops/rollout` and `critic/rewards/*`.
pub(crate) fn collect(
    run: &Run<'_>,
    loader: &mut PromptLoader,
    step: &mut Step,
) -> Result<Collected, TrainError> {
    let rows = loader.next_step();
    let records: Vec<&PromptRecord> = rows.iter().map(|r| loader.record(r)).collect();
    let local = local_rows(run, rows.len());
    let Sampled { batch, scores, gen_s, reward_s, flops } =
        sample(run, &records, local.clone(), step.number)?;
    step.timers.add("gen", gen_s);
    step.timers.add("reward", reward_s);
    step.metrics.insert("perf/tflops/rollout".into(), flops / gen_s / 1e12);
    let scores = ScoredBatch::concat(run.comm.gather(&scores)?);
    finish(run, &rows, &records, batch, local, scores, step)
}

/// This rank's rows of a step of `rows` rows: its share of the prompt groups.
pub(crate) fn local_rows(run: &Run<'_>, rows: usize) -> Range<usize> {
    let n = run.recipe.rollout.n;
    let groups = run.comm.share(rows / n);
    groups.start * n..groups.end * n
}

/// Rows `local` of a step's `records`, sampled and scored.
pub(crate) struct Sampled {
    pub batch: RolloutBatch,
    pub scores: ScoredBatch,
    /// Seconds of the rollout (scoring overlaps it) and of the scorers' work.
    pub gen_s: f64,
    pub reward_s: f64,
    /// The rollout's floating-point operations.
    pub flops: f64,
}

/// Samples and scores rows `local` of training step `number`'s `records`, each row seeded by its
/// place in the whole step.
pub(crate) fn sample(
    run: &Run<'_>,
    records: &[&PromptRecord],
    local: Range<usize>,
    number: u64,
) -> Result<Sampled, TrainError> {
    let (engine, recipe) = (&run.engine, run.recipe);
    let timer = Instant::now();
    let work = flowtune_models::flops::counted();
    let seeds = engine.row_seeds(records.len(), number);
    let Scored { batch, scores, reward_seconds } = rollout_and_score(
        engine,
        &records[local.clone()],
        &seeds[local],
        number,
        run.scorers(),
        (recipe.reward.on_error, recipe.reward.overlap),
    )?;
    // The rewards score on their own thread, so this thread's count is the rollout's alone.
    let flops = flowtune_models::flops::counted() - work;
    let gen_s = timer.elapsed().as_secs_f64();
    Ok(Sampled { batch, scores, gen_s, reward_s: reward_seconds, flops })
}

/// The step's rows `rows` (`records`), this rank's `local` ones sampled as `batch`, scored
/// `scores` over the whole step: logs the reward metrics and the grid, keeps the rows with a
/// reward.
pub(crate) fn finish(
    run: &Run<'_>,
    rows: &[Row],
    records: &[&PromptRecord],
    batch: RolloutBatch,
    local: Range<usize>,
    scores: ScoredBatch,
    step: &mut Step,
) -> Result<Collected, TrainError> {
    let (number, metrics) = (step.number, &mut step.metrics);
    let (engine, recipe, comm) = (&run.engine, run.recipe, &run.comm);
    if comm.is_main() {
        for e in &scores.errors {
            eprintln!("step {number}: skipped samples after a reward failure: {e}");
        }
    }
    metrics.extend(scores.metrics());
    // Where the SDE window sat (MixGRPO's strategies move it).
    let windows: Vec<Vec<Range<usize>>> = comm.gather(&batch.windows)?;
    let starts: Vec<f64> = windows.concat().iter().map(|w| w.start as f64).collect();
    metrics.insert("rollout/window_start".into(), starts.iter().sum::<f64>() / starts.len() as f64);
    let t = &recipe.trainer;
    if t.image_freq > 0 && number.is_multiple_of(t.image_freq) {
        let shown = rows.len().min(16);
        let mine = local.start.min(shown)..local.end.min(shown);
        let images = crate::images::gather(comm, &batch.images[..mine.len()])?;
        let captions: Vec<(String, f64)> = (0..shown)
            .map(|i| (records[i].prompt.clone(), scores.totals[i].unwrap_or(f64::NAN)))
            .collect();
        if comm.is_main() {
            let (dir, stem) =
                (Path::new(&t.output_dir).join("images"), format!("train_step_{number:06}"));
            let frames = engine.pipe.decoded_frames(&engine.latent_shape);
            crate::images::save_grid(&dir, &stem, &images, &captions, frames)?;
            let sounds = &batch.audio[..mine.len().min(batch.audio.len())];
            crate::images::save_sounds(&dir, &stem, sounds)?;
        }
    }
    let kept: Vec<usize> = (0..rows.len()).filter(|&i| scores.totals[i].is_some()).collect();
    if kept.is_empty() {
        let why = if scores.errors.is_empty() {
            "non-finite scores".to_string()
        } else {
            scores.errors.join("; ")
        };
        return Err(TrainError::NoSamples(format!(
            "step {number}: every sample was dropped by reward.on_error: skip_sample ({why})"
        )));
    }
    let rewards: Vec<f32> = kept.iter().map(|&i| scores.totals[i].unwrap() as f32).collect();
    let uids = kept.iter().map(|&i| rows[i].uid.clone()).collect();
    let details = kept.iter().map(|&i| scores.details[i].clone()).collect();
    let sources = kept.iter().map(|&i| records[i].data_source.clone()).collect();
    stats("critic/rewards", &rewards.iter().map(|&r| r as f64).collect::<Vec<_>>(), metrics);
    let device = batch.trajectory.final_latents.device();
    let first = kept.partition_point(|&i| i < local.start);
    let owned = first..kept.partition_point(|&i| i < local.end);
    let mine: Vec<i64> = kept[owned.clone()].iter().map(|&i| (i - local.start) as i64).collect();
    let kept = Rows::new(mine, device);
    Ok(Collected { batch, kept, rewards, uids, details, sources, owned })
}
