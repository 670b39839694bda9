//! Rollout and rewards together: each chunk of images (`rollout.batch_size` rows) is scored on a
//! worker thread while the model samples the next chunk (`reward.overlap`), or every image after
//! the rollout.

use std::sync::mpsc;
use std::time::Instant;

use flowtune_data::PromptRecord;
use flowtune_rewards::{
    score_batch, OnError, RewardError, RgbImage, Sample, ScoredBatch, Waveform, Weighted,
};

use flowtune_rollout::{Engine, RolloutBatch};

use crate::TrainError;

/// A rollout, its scores and the seconds the scorers were busy.
pub struct Scored {
    pub batch: RolloutBatch,
    pub scores: ScoredBatch,
    pub reward_seconds: f64,
}

/// Samples `records` (one row each, seeded by `seeds`) at training step `step` and scores the
/// images as they come, or with `overlap` off once they are all there.
pub fn rollout_and_score(
    engine: &Engine<'_>,
    records: &[&PromptRecord],
    seeds: &[u64],
    step: u64,
    scorers: &[Weighted],
    (on_error, overlap): (OnError, bool),
) -> Result<Scored, TrainError> {
    let prompts: Vec<&str> = records.iter().map(|r| r.prompt.as_str()).collect();
    let negatives: Vec<&str> = records
        .iter()
        .map(|r| r.negative_prompt.as_deref().unwrap_or(engine.pipe.default_negative_prompt()))
        .collect();
    let alpha = engine.pipe.takes_alpha();
    let pictures = records.iter().map(|r| r.load_images(alpha)).collect::<Result<Vec<_>, _>>()?;
    let pictures = if pictures.iter().all(Vec::is_empty) { vec![] } else { pictures };
    let frames = engine.pipe.decoded_frames(&engine.latent_shape);
    if !overlap {
        let batch = engine.rollout(&prompts, &negatives, &pictures, seeds, step)?;
        let (tx, rx) = mpsc::channel();
        let _ = tx.send((0, batch.images.clone(), batch.audio.clone()));
        drop(tx);
        let (scores, reward_seconds) = score_chunks(rx, records, frames, scorers, on_error)?;
        return Ok(Scored { batch, scores, reward_seconds });
    }
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel::<Chunk>();
        let worker = scope.spawn(move || score_chunks(rx, records, frames, scorers, on_error));
        let batch = engine.rollout_streaming(
            &prompts,
            &negatives,
            &pictures,
            seeds,
            step,
            &mut |first, images, sounds| {
                // A closed channel means the worker stopped on an error, which join reports.
                let _ = tx.send((first, images.to_vec(), sounds.to_vec()));
            },
        );
        drop(tx);
        let scored = worker.join().expect("the reward thread does not panic");
        let batch = batch?;
        let (scores, reward_seconds) = scored?;
        Ok(Scored { batch, scores, reward_seconds })
    })
}

/// A chunk of decoded rows: the first row's index, the images and their sounds (none for a
/// silent family).
type Chunk = (usize, Vec<RgbImage>, Vec<Waveform>);

/// Scores chunks in arrival order until the sender hangs up; each image holds `frames` frames
/// side by side.
fn score_chunks(
    chunks: mpsc::Receiver<Chunk>,
    records: &[&PromptRecord],
    frames: usize,
    scorers: &[Weighted],
    on_error: OnError,
) -> Result<(ScoredBatch, f64), RewardError> {
    let mut parts = vec![];
    let mut busy = 0.0;
    for (first, images, sounds) in chunks {
        let timer = Instant::now();
        let samples: Vec<Sample<'_>> = records[first..first + images.len()]
            .iter()
            .zip(&images)
            .enumerate()
            .map(|(k, (r, image))| Sample {
                image,
                frames,
                audio: sounds.get(k),
                prompt: &r.prompt,
                ground_truth: r.ground_truth.as_deref(),
                data_source: &r.data_source,
                extra_info: &r.extra_info,
            })
            .collect();
        parts.push(score_batch(scorers, &samples, on_error)?);
        busy += timer.elapsed().as_secs_f64();
    }
    Ok((ScoredBatch::concat(parts), busy))
}
