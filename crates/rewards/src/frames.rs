//! Image rewards on video samples: a clip arrives as its frames side by side; each scorer sees
//! every `frame_interval`-th frame as a picture of its own, and a sample's score (and each extra)
//! is the mean over those frames, as the reference's OCR judge does for video.

use std::collections::BTreeMap;

use crate::{Reward, RewardError, RgbImage, Sample, Score};

/// A reward applied frame by frame to video samples (pictures pass straight through).
pub struct PerFrame {
    inner: Box<dyn Reward>,
    /// Score frames 0, k, 2k, …
    interval: usize,
}

impl PerFrame {
    /// `inner` on every `interval`-th frame (≥ 1).
    pub fn new(inner: Box<dyn Reward>, interval: usize) -> Self {
        Self { inner, interval: interval.max(1) }
    }
}

/// Frame `i` of `frames` laid side by side in `strip`.
pub fn frame(strip: &RgbImage, frames: usize, i: usize) -> RgbImage {
    let width = strip.width() / frames as u32;
    image::imageops::crop_imm(strip, i as u32 * width, 0, width, strip.height()).to_image()
}

impl Reward for PerFrame {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn score(&self, samples: &[Sample<'_>]) -> Result<Vec<Score>, RewardError> {
        if samples.iter().all(|s| s.frames <= 1) {
            return self.inner.score(samples);
        }
        // Every scored frame of every sample, and which sample it belongs to.
        let mut pictures = vec![];
        let mut owner = vec![];
        for (i, s) in samples.iter().enumerate() {
            if s.frames == 0 || s.image.width() % s.frames as u32 != 0 {
                return Err(RewardError::Failed {
                    reward: self.name().into(),
                    message: format!(
                        "a {}-pixel-wide video sample cannot hold {} frames side by side",
                        s.image.width(),
                        s.frames
                    ),
                });
            }
            for f in (0..s.frames).step_by(self.interval) {
                pictures.push(frame(s.image, s.frames, f));
                owner.push(i);
            }
        }
        let frames: Vec<Sample<'_>> = pictures
            .iter()
            .zip(&owner)
            .map(|(image, &i)| Sample { image, frames: 1, ..samples[i] })
            .collect();
        let scores = self.inner.score(&frames)?;
        if scores.len() != frames.len() {
            return Err(RewardError::Failed {
                reward: self.name().into(),
                message: format!("returned {} scores for {} frames", scores.len(), frames.len()),
            });
        }
        let mut per_sample: Vec<Vec<Score>> = vec![vec![]; samples.len()];
        for (score, &i) in scores.into_iter().zip(&owner) {
            per_sample[i].push(score);
        }
        Ok(per_sample.iter().map(|frames| mean(frames)).collect())
    }
}

/// The mean of frames' scores: the value over all of them, each extra over those that have it.
fn mean(frames: &[Score]) -> Score {
    let mut extras: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    for (k, v) in frames.iter().flat_map(|s| &s.extras) {
        let e = extras.entry(k).or_default();
        e.0 += v;
        e.1 += 1;
    }
    Score {
        value: frames.iter().map(|s| s.value).sum::<f64>() / frames.len() as f64,
        extras: extras.into_iter().map(|(k, (s, n))| (k.to_string(), s / n as f64)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JpegSize;

    /// Three distinct 16×12 frames side by side.
    fn strip() -> RgbImage {
        RgbImage::from_fn(48, 12, |x, y| {
            let f = x / 16;
            image::Rgb([(x * 13 + y * 7) as u8, (f * 90) as u8, ((x * y) % 251) as u8])
        })
    }

    fn sample<'a>(image: &'a RgbImage, frames: usize, extra: &'a serde_json::Value) -> Sample<'a> {
        Sample {
            image,
            frames,
            audio: None,
            prompt: "a clip",
            ground_truth: None,
            data_source: "t",
            extra_info: extra,
        }
    }

    #[test]
    fn a_video_scores_the_mean_of_its_frames_scored_as_pictures() {
        let (video, null) = (strip(), serde_json::Value::Null);
        let frames: Vec<RgbImage> = (0..3).map(|i| frame(&video, 3, i)).collect();
        assert_eq!(frames[1], image::imageops::crop_imm(&video, 16, 0, 16, 12).to_image());
        let alone = JpegSize { compressible: false }
            .score(&frames.iter().map(|f| sample(f, 1, &null)).collect::<Vec<_>>())
            .unwrap();
        for (interval, picked) in [(1, vec![0, 1, 2]), (2, vec![0, 2]), (5, vec![0])] {
            let reward = PerFrame::new(Box::new(JpegSize { compressible: false }), interval);
            let picture = frame(&video, 3, 0);
            // A batch mixing a clip and a picture: the picture is scored as it is.
            let got =
                reward.score(&[sample(&video, 3, &null), sample(&picture, 1, &null)]).unwrap();
            let want = picked.iter().map(|&i| alone[i].value).sum::<f64>() / picked.len() as f64;
            assert!(
                (got[0].value - want).abs() < 1e-12,
                "interval {interval}: {} vs {want}",
                got[0].value
            );
            assert_eq!(got[1].value, alone[0].value);
        }
    }

    #[test]
    fn frames_that_do_not_divide_the_width_are_refused() {
        let (video, null) = (strip(), serde_json::Value::Null);
        let reward = PerFrame::new(Box::new(JpegSize { compressible: true }), 1);
        let err = reward.score(&[sample(&video, 5, &null)]).unwrap_err().to_string();
        assert!(err.contains("48-pixel-wide") && err.contains("5 frames"), "{err}");
    }
}
