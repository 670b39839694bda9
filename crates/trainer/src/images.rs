//! Pictures people look at: a captioned grid PNG of a step's images, with a JSONL of the captions.

use std::path::Path;

use flowtune_report::{captioned_grid, Caption};
use flowtune_rewards::RgbImage;

use crate::TrainError;

/// Writes `<stem>.png` (the grid, each tile captioned with its prompt and score; green/red when
/// every score is 0 or 1) and `<stem>.jsonl` (one caption per tile: prompt and score).
pub fn save_grid(
    dir: &Path,
    stem: &str,
    images: &[RgbImage],
    captions: &[(String, f64)],
) -> Result<(), TrainError> {
    std::fs::create_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
    let png = dir.join(format!("{stem}.png"));
    let binary = captions.iter().all(|(_, s)| *s == 0.0 || *s == 1.0);
    let labels: Vec<Caption> = captions
        .iter()
        .map(|(prompt, score)| Caption {
            text: format!("{prompt} ({score:.3})"),
            verdict: binary.then_some(*score == 1.0),
        })
        .collect();
    let side = images.first().map_or(1, |i| i.width());
    let cell = side.clamp(128, 256);
    let columns = (images.len() as f64).sqrt().ceil() as u32;
    captioned_grid(images, &labels, cell, columns, 4)
        .save(&png)
        .map_err(|source| TrainError::Image { path: png.clone(), source })?;
    let lines: Vec<String> = captions
        .iter()
        .enumerate()
        .map(|(i, (prompt, score))| {
            serde_json::json!({ "index": i, "prompt": prompt, "score": score }).to_string()
        })
        .collect();
    let jsonl = dir.join(format!("{stem}.jsonl"));
    std::fs::write(&jsonl, lines.join("\n") + "\n").map_err(|e| TrainError::io(&jsonl, e))
}
