//! Validation: η = 0 rollouts of the validation prompts with fixed per-prompt seeds, scored and
//! averaged per data source, with a captioned grid of the images. Ranks share the prompts.

use std::collections::BTreeMap;

use flowtune_config::Recipe;
use flowtune_data::PromptRecord;
use flowtune_objectives::Metrics;
use flowtune_rollout::Engine;
use flowtune_sampling::{row_seed, SigmaGrid};

use crate::run::Run;
use crate::scoring::{rollout_and_score, Scored};
use crate::seeds::VALIDATION;
use crate::TrainError;

/// A validation sample's total reward (none when dropped) and its reward extras.
type Verdict = (Option<f64>, BTreeMap<String, f64>);

/// Validation rollouts: η = 0, `rollout.eval_steps`, fixed per-prompt seeds from 42; rewards
/// averaged per data source as `val-core/<source>/reward/mean@1`, each reward extra as
/// `val-core/<source>/<extra>` (e.g. `val-core/shapes/counting/acc`), and a grid of the images.
///
/// A `grid` (a few-step student's, [`crate::algorithms::Algorithm::sampling_grid`]) replaces the
/// pipeline's grid, and the rollouts sample without guidance.
pub(crate) fn validate(
    run: &Run<'_>,
    records: &[PromptRecord],
    k: u64,
    grid: Option<&SigmaGrid>,
) -> Result<Metrics, TrainError> {
    let (recipe, comm) = (run.recipe, &run.comm);
    let sampler = validation_sampler(recipe, grid);
    let engine = sampling_engine(run, &sampler, grid, VALIDATION)?;
    // Each rank samples its share of the prompts; prompt i's noise comes from
    // `row_seed(42, 0, i)`: fixed, different per prompt, whichever rank draws it.
    let mine = comm.share(records.len());
    let mut rows: Vec<&PromptRecord> = records[mine.clone()].iter().collect();
    // Under sharded blocks every rank takes part in each block's gather, so every rank samples
    // as many rows: a short share is filled with copies of a prompt whose results are dropped.
    if let (true, Some(filler)) =
        (run.layout.sharded_blocks, records.get(mine.start.min(records.len().saturating_sub(1))))
    {
        rows.resize(records.len().div_ceil(comm.groups()), filler);
    }
    let mut scored: Vec<Verdict> = vec![];
    let (mut images, mut sounds) = (vec![], vec![]);
    let size = recipe.trainer.micro_batch_size;
    for (c, chunk) in rows.chunks(size).enumerate() {
        let chunk: Vec<&PromptRecord> = chunk.to_vec();
        let first = (mine.start + c * size) as u64;
        let seeds: Vec<u64> =
            (first..first + chunk.len() as u64).map(|i| row_seed(VALIDATION, 0, i)).collect();
        let Scored { batch, scores, .. } = rollout_and_score(
            &engine,
            &chunk,
            &seeds,
            1,
            run.scorers(),
            (recipe.reward.on_error, recipe.reward.overlap),
        )?;
        for (total, details) in scores.totals.into_iter().zip(scores.details) {
            scored.push((total, details.extras));
        }
        images.extend(batch.images);
        sounds.extend(batch.audio);
    }
    scored.truncate(mine.len());
    images.truncate(mine.len());
    sounds.truncate(mine.len().min(64));
    let scored: Vec<Vec<Verdict>> = comm.gather(&scored)?;
    let shown = records.len().min(64);
    let images =
        crate::images::gather(comm, &images[..(mine.end.min(shown)).saturating_sub(mine.start)])?;
    // Per data source: the total reward and each extra (e.g. a category's accuracy).
    let mut per_source: BTreeMap<(String, String), (f64, usize)> = BTreeMap::new();
    let mut captions = vec![];
    for (r, (total, extras)) in records.iter().zip(scored.concat()) {
        if let Some(v) = total {
            let extras = extras.iter().map(|(k, v)| (k.as_str(), *v));
            for (key, value) in std::iter::once(("reward/mean@1", v)).chain(extras) {
                let e = per_source.entry((r.data_source.clone(), key.to_string())).or_default();
                e.0 += value;
                e.1 += 1;
            }
        }
        captions.push((r.prompt.clone(), total.unwrap_or(f64::NAN)));
    }
    if comm.is_main() {
        let (dir, stem) = (recipe.trainer.output_dir.join("images"), format!("val_step_{k:06}"));
        let frames = engine.pipe.decoded_frames(&engine.latent_shape);
        crate::images::save_grid(&dir, &stem, &images, &captions[..shown], frames)?;
        crate::images::save_sounds(&dir, &stem, &sounds)?;
    }
    Ok(per_source
        .into_iter()
        .map(|((source, key), (sum, n))| (format!("val-core/{source}/{key}"), sum / n as f64))
        .collect())
}

/// The sampler of validation rollouts: η = 0, `rollout.eval_steps`, no SDE window, each row its
/// own noise (a validation file may repeat a prompt); on a student's `grid`, its steps without
/// CFG (scale 0 runs none in any family, `Denoiser::runs_cfg`).
pub(crate) fn validation_sampler(
    recipe: &Recipe,
    grid: Option<&SigmaGrid>,
) -> flowtune_sampling::SamplerConfig {
    let plain = flowtune_sampling::SamplerConfig {
        noise_level: 0.0,
        steps: recipe.rollout.eval_steps,
        sde_window_size: 0,
        sde_window_range: None,
        same_noise: false,
        ..recipe.rollout.clone()
    };
    match grid {
        Some(grid) => flowtune_sampling::SamplerConfig {
            steps: grid.timesteps.len(),
            guidance_scale: 0.0,
            guidance_scale_2: None,
            ..plain
        },
        None => plain,
    }
}

/// An engine of `sampler` on the run's pipeline, seeded `seed`, on `grid` when given.
pub(crate) fn sampling_engine<'a>(
    run: &Run<'a>,
    sampler: &'a flowtune_sampling::SamplerConfig,
    grid: Option<&SigmaGrid>,
    seed: u64,
) -> Result<Engine<'a>, TrainError> {
    let engine = Engine::new(run.engine.pipe, sampler, run.engine.latent_shape.clone(), seed)?;
    Ok(match grid {
        Some(grid) => engine.with_grid(grid.clone()),
        None => engine,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Training settings that vary samples (η, the window, shared group noise) stay out of
    /// validation.
    #[test]
    fn validation_samples_each_row_deterministically_from_its_own_noise() {
        let yaml = "algorithm: flow_grpo\nmodel: {path: m}\ndata: {train_files: [t.txt]}\n";
        let overrides = ["rollout.same_noise=true".into(), "rollout.eval_steps=7".into()];
        let recipe = Recipe::from_yaml(yaml, "r.yaml", &overrides).expect("recipe");
        assert!(recipe.rollout.same_noise);
        let sampler = validation_sampler(&recipe, None);
        assert!(!sampler.same_noise);
        assert_eq!((sampler.noise_level, sampler.steps, sampler.sde_window_size), (0.0, 7, 0));
    }
}
