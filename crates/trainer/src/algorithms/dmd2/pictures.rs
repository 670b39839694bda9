//! What a DMD2 run shows every `trainer.image_freq` steps: the student's samples of the step's
//! prompts (its whole grid, without guidance), scored by the recipe's rewards (which its loss does
//! not use), as a captioned grid and the `critic/rewards/*` metrics.

use flowtune_rewards::ScoredBatch;
use flowtune_sampling::SigmaGrid;

use super::student::Attempt;
use crate::logging::stats;
use crate::run::Run;
use crate::scoring::{rollout_and_score, Scored};
use crate::step::Step;
use crate::validation::{sampling_engine, validation_sampler};
use crate::TrainError;

/// Samples and scores `attempt`'s prompts with the student on `grid` when step `step` is due for
/// pictures; every rank its own rows.
pub(super) fn show(
    run: &Run<'_>,
    attempt: &Attempt,
    grid: SigmaGrid,
    step: &mut Step,
) -> Result<(), TrainError> {
    let (recipe, comm, number) = (run.recipe, &run.comm, step.number);
    let every = recipe.trainer.image_freq;
    if every == 0 || !number.is_multiple_of(every) {
        return Ok(());
    }
    let sampler = validation_sampler(recipe, Some(&grid));
    let engine = sampling_engine(run, &sampler, Some(&grid), recipe.seed)?;
    let records: Vec<_> = attempt.records.iter().collect();
    let seeds = engine.row_seeds(records.len(), number);
    let local = attempt.local.clone();
    let reward = &recipe.reward;
    let Scored { batch, scores, .. } = step.timers.time("gen", || {
        let (records, seeds) = (&records[local.clone()], &seeds[local.clone()]);
        rollout_and_score(&engine, records, seeds, number, run.scorers(), (reward.on_error, true))
    })?;
    let scores = ScoredBatch::concat(comm.gather(&scores)?);
    step.metrics.extend(scores.metrics());
    let totals: Vec<f64> = scores.totals.iter().flatten().copied().collect();
    stats("critic/rewards", &totals, &mut step.metrics);
    let shown = records.len().min(16);
    let mine = local.start.min(shown)..local.end.min(shown);
    let images = crate::images::gather(comm, &batch.images[..mine.len()])?;
    if comm.is_main() {
        let captions: Vec<(String, f64)> = (0..shown)
            .map(|i| (records[i].prompt.clone(), scores.totals[i].unwrap_or(f64::NAN)))
            .collect();
        crate::images::save_grid(
            &recipe.trainer.output_dir.join("images"),
            &format!("train_step_{number:06}"),
            &images,
            &captions,
            engine.pipe.decoded_frames(&engine.latent_shape),
        )?;
    }
    Ok(())
}
