//! The first half of an online step: a step's prompts sampled `n` times and scored, with the
//! reward metrics, the periodic grid of training images, and the rows a reward failure dropped.

use std::path::Path;
use std::time::Instant;

use flowtune_data::{PromptLoader, PromptRecord};
use flowtune_objectives::Metrics;
use flowtune_rollout::RolloutBatch;
use tch::Tensor;

use crate::run::Run;
use crate::scoring::{rollout_and_score, Scored};
use crate::TrainError;

/// A scored rollout, restricted to the rows that have a reward.
pub(crate) struct Collected {
    pub batch: RolloutBatch,
    /// Batch rows with a reward, as a tensor on the model's device.
    pub kept: Tensor,
    /// Their rewards and group ids (one uid per prompt).
    pub rewards: Vec<f32>,
    pub uids: Vec<String>,
}

/// Min, max and mean of `values` under `prefix/`.
pub(crate) fn stats(prefix: &str, values: &[f64], out: &mut Metrics) {
    let n = values.len().max(1) as f64;
    out.insert(format!("{prefix}/mean"), values.iter().sum::<f64>() / n);
    out.insert(format!("{prefix}/max"), values.iter().cloned().fold(f64::NEG_INFINITY, f64::max));
    out.insert(format!("{prefix}/min"), values.iter().cloned().fold(f64::INFINITY, f64::min));
}

impl Collected {
    /// Group advantages of the kept rows broadcast over `steps` trained steps, (rows, steps) on
    /// the model's device; logs `critic/rewards/zero_std_ratio` and `critic/advantages/*`.
    pub fn advantages(
        &self,
        steps: usize,
        config: &flowtune_objectives::AdvantageConfig,
        m: &mut Metrics,
    ) -> Result<Tensor, TrainError> {
        let uids: Vec<&str> = self.uids.iter().map(String::as_str).collect();
        let adv = flowtune_objectives::group_advantages(&self.rewards, &uids, steps, config)?;
        m.insert("critic/rewards/zero_std_ratio".into(), adv.zero_std_ratio);
        let first: Vec<f64> =
            Vec::<f32>::try_from(adv.values.select(1, 0))?.into_iter().map(f64::from).collect();
        stats("critic/advantages", &first, m);
        Ok(adv.values.to_device(self.kept.device()))
    }
}

/// Samples and scores step `k`'s prompts; logs `timing_s/{gen,reward}` and `critic/rewards/*`.
pub(crate) fn collect(
    run: &Run<'_>,
    loader: &mut PromptLoader,
    k: u64,
    m: &mut Metrics,
) -> Result<Collected, TrainError> {
    let (engine, recipe) = (&run.engine, run.recipe);
    let rows = loader.next_step();
    let records: Vec<&PromptRecord> = rows.iter().map(|r| loader.record(r)).collect();
    let timer = Instant::now();
    let seeds = engine.row_seeds(records.len(), k);
    let Scored { batch, scores, reward_seconds } =
        rollout_and_score(engine, &records, &seeds, k, &run.scorers, recipe.reward.on_error)?;
    m.insert("timing_s/gen".into(), timer.elapsed().as_secs_f64());
    m.insert("timing_s/reward".into(), reward_seconds);
    for e in &scores.errors {
        eprintln!("step {k}: skipped samples after a reward failure: {e}");
    }
    m.extend(scores.metrics());
    // Where the SDE window sat (MixGRPO's strategies move it).
    let starts: Vec<f64> = batch.windows.iter().map(|w| w.start as f64).collect();
    m.insert("rollout/window_start".into(), starts.iter().sum::<f64>() / starts.len() as f64);
    let t = &recipe.trainer;
    if t.image_freq > 0 && k.is_multiple_of(t.image_freq) {
        let shown = batch.images.len().min(16);
        let captions: Vec<(String, f64)> = (0..shown)
            .map(|i| (records[i].prompt.clone(), scores.totals[i].unwrap_or(f64::NAN)))
            .collect();
        crate::images::save_grid(
            &Path::new(&t.output_dir).join("images"),
            &format!("train_step_{k:06}"),
            &batch.images[..shown],
            &captions,
        )?;
    }
    let kept: Vec<usize> = (0..rows.len()).filter(|&i| scores.totals[i].is_some()).collect();
    if kept.is_empty() {
        let why = if scores.errors.is_empty() {
            "non-finite scores".to_string()
        } else {
            scores.errors.join("; ")
        };
        return Err(TrainError::NoSamples(format!(
            "step {k}: every sample was dropped by reward.on_error: skip_sample ({why})"
        )));
    }
    let rewards: Vec<f32> = kept.iter().map(|&i| scores.totals[i].unwrap() as f32).collect();
    let uids = kept.iter().map(|&i| rows[i].uid.clone()).collect();
    stats("critic/rewards", &rewards.iter().map(|&r| r as f64).collect::<Vec<_>>(), m);
    let device = batch.trajectory.final_latents.device();
    let kept =
        Tensor::from_slice(&kept.iter().map(|&i| i as i64).collect::<Vec<_>>()).to_device(device);
    Ok(Collected { batch, kept, rewards, uids })
}
