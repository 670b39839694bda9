//! Validation: η = 0 rollouts of the validation prompts with fixed per-prompt seeds, scored and
//! averaged per data source, with a captioned grid of the images.

use std::collections::BTreeMap;

use flowtune_config::Recipe;
use flowtune_data::PromptRecord;
use flowtune_objectives::Metrics;
use flowtune_rollout::Engine;
use flowtune_sampling::row_seed;

use crate::run::Run;
use crate::scoring::{rollout_and_score, Scored};
use crate::seeds::VALIDATION;
use crate::TrainError;

/// Validation rollouts: η = 0, `rollout.eval_steps`, fixed per-prompt seeds from 42; rewards
/// averaged per data source as `val-core/<source>/reward/mean@1`, each reward extra as
/// `val-core/<source>/<extra>` (e.g. `val-core/shapes/counting/acc`), and a grid of the images.
pub(crate) fn validate(
    run: &Run<'_>,
    records: &[PromptRecord],
    k: u64,
) -> Result<Metrics, TrainError> {
    let recipe = run.recipe;
    let sampler = validation_sampler(recipe);
    let engine =
        Engine::new(run.engine.pipe, &sampler, run.engine.latent_shape.clone(), VALIDATION)?;
    // Per data source: the total reward and each extra (e.g. a category's accuracy).
    let mut per_source: BTreeMap<(String, String), (f64, usize)> = BTreeMap::new();
    let (mut images, mut captions) = (vec![], vec![]);
    let size = recipe.trainer.micro_batch_size;
    for (c, chunk) in records.chunks(size).enumerate() {
        let chunk: Vec<&PromptRecord> = chunk.iter().collect();
        // Prompt i's noise comes from `row_seed(42, 0, i)`: fixed, and different per prompt.
        let first = (c * size) as u64;
        let seeds: Vec<u64> =
            (first..first + chunk.len() as u64).map(|i| row_seed(VALIDATION, 0, i)).collect();
        let Scored { batch, scores, .. } =
            rollout_and_score(&engine, &chunk, &seeds, 1, &run.scorers, recipe.reward.on_error)?;
        for (i, r) in chunk.iter().enumerate() {
            let total = scores.totals[i];
            if let Some(v) = total {
                let source = &r.data_source;
                let extras = scores.details[i].extras.iter().map(|(k, v)| (k.as_str(), *v));
                for (key, value) in std::iter::once(("reward/mean@1", v)).chain(extras) {
                    let e = per_source.entry((source.clone(), key.to_string())).or_default();
                    e.0 += value;
                    e.1 += 1;
                }
            }
            captions.push((r.prompt.clone(), total.unwrap_or(f64::NAN)));
        }
        images.extend(batch.images);
    }
    let shown = images.len().min(64);
    crate::images::save_grid(
        &recipe.trainer.output_dir.join("images"),
        &format!("val_step_{k:06}"),
        &images[..shown],
        &captions[..shown],
    )?;
    Ok(per_source
        .into_iter()
        .map(|((source, key), (sum, n))| (format!("val-core/{source}/{key}"), sum / n as f64))
        .collect())
}

/// The sampler of validation rollouts: η = 0, `rollout.eval_steps`, no SDE window.
pub(crate) fn validation_sampler(recipe: &Recipe) -> flowtune_sampling::SamplerConfig {
    flowtune_sampling::SamplerConfig {
        noise_level: 0.0,
        steps: recipe.rollout.eval_steps,
        sde_window_size: 0,
        sde_window_range: None,
        ..recipe.rollout.clone()
    }
}
