//! Pictures people look at: a captioned grid PNG of a step's images, with a JSONL of the captions.

use std::path::Path;

use flowtune_report::{captioned_grid, Caption};
use flowtune_rewards::RgbImage;

use crate::dist::Comm;
use crate::TrainError;

/// Every rank's `images`, in rank order (rank 0 draws the grids of a job).
pub(crate) fn gather(comm: &Comm, images: &[RgbImage]) -> Result<Vec<RgbImage>, TrainError> {
    let mine: Vec<(u32, u32, &[u8])> =
        images.iter().map(|i| (i.width(), i.height(), i.as_raw().as_slice())).collect();
    let all: Vec<Vec<(u32, u32, Vec<u8>)>> = comm.gather(&mine)?;
    all.into_iter()
        .flatten()
        .map(|(w, h, raw)| {
            RgbImage::from_raw(w, h, raw).ok_or_else(|| {
                TrainError::Distributed(format!("a gathered {w}×{h} image has the wrong size"))
            })
        })
        .collect()
}

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
