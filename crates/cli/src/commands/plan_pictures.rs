//! The condition pictures `flowtune plan` counts: the pictures the prompt rows of
//! `data.train_files` and `data.val_files` name (read from their headers), sized as the
//! pipeline sizes them; the row whose pictures add the most tokens stands for every row.

use std::path::Path;

use anyhow::Context;
use flowtune_config::Recipe;
use flowtune_data::{picture_size, PromptDataset};
use flowtune_models::ConditionSizes;

/// The largest row's condition pictures under the pipeline at `model_dir`; none when no row
/// names a picture. A prompt file that does not exist is left to the trainer's check, which
/// names it; a picture that cannot be read is named here.
pub(crate) fn largest(recipe: &Recipe, model_dir: &Path) -> anyhow::Result<ConditionSizes> {
    let d = &recipe.data;
    let files = d.train_files.iter().chain(&d.val_files).filter(|f| f.exists());
    let mut rows = vec![];
    for file in files {
        let data = PromptDataset::load(file).with_context(|| format!("{}", file.display()))?;
        for record in data.records.iter().filter(|r| !r.images.is_empty()) {
            let sizes = record.images.iter().map(|p| picture_size(p));
            rows.push(sizes.collect::<Result<Vec<_>, _>>()?);
        }
    }
    rows.sort_unstable();
    rows.dedup();
    let resolution = recipe.model.output_resolution.map(|r| r as u32);
    let sized = flowtune_models::condition_sizes(model_dir, &rows, resolution)?;
    // Image tokens grow with the encoded area; the text's vision tokens come second.
    let area =
        |s: &ConditionSizes| s.encoded.iter().map(|&(w, h)| w as u64 * h as u64).sum::<u64>();
    Ok(sized.into_iter().max_by_key(|s| (area(s), s.text_tokens)).unwrap_or_default())
}
