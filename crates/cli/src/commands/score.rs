//! `flowtune score`: scores a folder of images with any registered reward, one JSON line per image
//! — for checking a scorer (a reward server, a VLM judge) before training with it.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use clap::Args;
use flowtune_data::PromptDataset;
use flowtune_rewards::{score_batch, OnError, RewardConfig, RewardFunction, Sample};
use serde_json::json;

use crate::Failure;

#[derive(Args)]
pub struct ScoreArgs {
    /// A registered reward name (`flowtune list`), with its default settings.
    #[arg(long, conflicts_with = "reward_config", required_unless_present = "reward_config")]
    reward: Option<String>,
    /// A YAML file holding a recipe's `reward:` section (`functions: [...]`), for rewards with
    /// settings (`http`, `vlm_judge`).
    #[arg(long)]
    reward_config: Option<PathBuf>,
    /// The images (PNG or JPEG), scored in file-name order.
    #[arg(long)]
    images: PathBuf,
    /// The prompts, one per image in the same order: text, JSONL or parquet, as for training
    /// (ground truths from `reward_model.ground_truth` or the prompt's quoted text).
    #[arg(long)]
    prompts: PathBuf,
    /// Images per call to the scorers.
    #[arg(long, default_value_t = 16)]
    batch: usize,
}

/// The reward section named on the command line: a reward `name` with its default settings, or
/// the `reward:` section in `file`.
pub fn reward_section(name: Option<&str>, file: Option<&Path>) -> Result<RewardConfig, Failure> {
    if let Some(name) = name {
        return Ok(RewardConfig {
            functions: vec![RewardFunction::named(name)],
            on_error: OnError::Fail,
            overlap: true,
        });
    }
    let path = file.expect("clap requires a reward name or a reward file");
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {}", path.display()))
        .map_err(Failure::BadInput)?;
    serde_yaml::from_str(&text)
        .with_context(|| {
            format!("{}: expected a reward section (functions: [...])", path.display())
        })
        .map_err(Failure::BadInput)
}

/// The image files of `dir` in name order.
fn image_files(dir: &Path) -> Result<Vec<PathBuf>, Failure> {
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))
        .map_err(Failure::BadInput)?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| ["png", "jpg", "jpeg"].contains(&e.to_lowercase().as_str()))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Prints `{"file", "prompt", "score", "scores", "extras", "error"}` per image; fails (exit 1) when
/// any image has no score.
pub fn run(a: ScoreArgs) -> Result<(), Failure> {
    let config = reward_section(a.reward.as_deref(), a.reward_config.as_deref())?;
    let scorers = flowtune_rewards::build(&config).map_err(Failure::input)?;
    let files = image_files(&a.images)?;
    let records = PromptDataset::load(&a.prompts).map_err(Failure::input)?.records;
    if files.len() != records.len() || files.is_empty() {
        return Err(Failure::input(anyhow!(
            "{} holds {} images and {} holds {} prompts; expected one prompt per image",
            a.images.display(),
            files.len(),
            a.prompts.display(),
            records.len()
        )));
    }
    let mut failed = 0;
    for (files, records) in files.chunks(a.batch.max(1)).zip(records.chunks(a.batch.max(1))) {
        let images = files
            .iter()
            .map(|f| image::open(f).map(|i| i.to_rgb8()).with_context(|| f.display().to_string()))
            .collect::<anyhow::Result<Vec<_>>>()
            .map_err(Failure::BadInput)?;
        let samples: Vec<Sample<'_>> = images
            .iter()
            .zip(records)
            .map(|(image, r)| Sample {
                image,
                frames: 1,
                audio: None,
                prompt: &r.prompt,
                ground_truth: r.ground_truth.as_deref(),
                data_source: &r.data_source,
                extra_info: &r.extra_info,
            })
            .collect();
        // Failures are reported per image here, not fatal to the rest of the folder.
        let out = score_batch(&scorers, &samples, OnError::SkipSample)
            .map_err(|e| Failure::Runtime(e.into()))?;
        for (i, file) in files.iter().enumerate() {
            let error = match out.totals[i] {
                Some(_) => None,
                None if out.errors.is_empty() => Some("a non-finite score".to_string()),
                None => Some(out.errors.join("; ")),
            };
            failed += usize::from(error.is_some());
            let line = json!({
                "file": file.file_name().map(|n| n.to_string_lossy()),
                "prompt": records[i].prompt,
                "score": out.totals[i],
                "scores": out.details[i].by_scorer,
                "extras": out.details[i].extras,
                "error": error,
            });
            println!("{line}");
        }
    }
    if failed > 0 {
        return Err(Failure::Runtime(anyhow!(
            "{failed} of the images have no score (see `error`)"
        )));
    }
    Ok(())
}
