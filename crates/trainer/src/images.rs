//! Pictures people look at: a captioned grid PNG of a step's images, with a JSONL of the captions.

use std::path::Path;

use flowtune_report::{captioned_grid, write_gif, Caption};
use flowtune_rewards::{frame, RgbImage, Waveform};

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

/// Frames per second of the animated grids of video samples.
const FPS: u32 = 8;

/// Writes `<stem>.png` (the grid, each tile captioned with its prompt and score; green/red when
/// every score is 0 or 1) and `<stem>.jsonl` (one caption per tile: prompt and score). Video
/// samples (`frames` side by side in each image) tile as strips in the PNG and also play in
/// `<stem>.gif`, a grid per frame, and in `<stem>.mp4` where `ffmpeg` is installed.
pub fn save_grid(
    dir: &Path,
    stem: &str,
    images: &[RgbImage],
    captions: &[(String, f64)],
    frames: usize,
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
    let grid = |images: &[RgbImage]| {
        let side = images.first().map_or(1, |i| i.width());
        let columns = (images.len() as f64).sqrt().ceil() as u32;
        captioned_grid(images, &labels, side.clamp(128, 256), columns, 4)
    };
    grid(images).save(&png).map_err(|source| TrainError::Image { path: png.clone(), source })?;
    if frames > 1 {
        let gif = dir.join(format!("{stem}.gif"));
        let played: Vec<RgbImage> = (0..frames)
            .map(|f| grid(&images.iter().map(|i| frame(i, frames, f)).collect::<Vec<_>>()))
            .collect();
        write_gif(&gif, &played, FPS)
            .map_err(|source| TrainError::Image { path: gif.clone(), source })?;
        to_mp4(&gif);
    }
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

/// Writes each of `sounds` (the first tiles' sounds, in tile order: rank 0's samples) as
/// `<stem>_<tile>.wav` beside the grid, for a family with sound.
pub fn save_sounds(dir: &Path, stem: &str, sounds: &[Waveform]) -> Result<(), TrainError> {
    for (i, sound) in sounds.iter().enumerate() {
        let path = dir.join(format!("{stem}_{i:02}.wav"));
        let bytes = sound.wav()?;
        std::fs::write(&path, bytes).map_err(|e| TrainError::io(&path, e))?;
    }
    Ok(())
}

/// `<stem>.mp4` beside an animated grid, where `ffmpeg` is installed (H.264, even sides); a failed
/// conversion is reported, an absent ffmpeg is not an error.
fn to_mp4(gif: &Path) {
    let mp4 = gif.with_extension("mp4");
    let run = std::process::Command::new("ffmpeg")
        .args(["-y", "-loglevel", "error", "-i"])
        .arg(gif)
        .args(["-movflags", "faststart", "-pix_fmt", "yuv420p"])
        .args(["-vf", "scale=trunc(iw/2)*2:trunc(ih/2)*2"])
        .arg(&mp4)
        .output();
    match run {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => eprintln!("{}: ffmpeg could not start: {e}", mp4.display()),
        Ok(out) if !out.status.success() => eprintln!(
            "{}: ffmpeg failed: {}",
            mp4.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Ok(_) => {}
    }
}
