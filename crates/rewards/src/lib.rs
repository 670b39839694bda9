//! Rewards: what a generated image is worth. A [`Reward`] scores a batch of samples; the
//! registry builds scorers by name from the recipe's `reward` section; [`score_batch`] combines
//! weighted scorers and applies the failure policy — a failed or NaN score stops the step with a
//! clear message, or (with `on_error: skip_sample`) drops the sample and counts it, never a
//! silent 0. Video samples are scored frame by frame ([`PerFrame`]).

mod brightness;
mod clip;
mod config;
mod endpoint;
mod frames;
mod hpsv3;
mod http;
mod jpeg;
mod loudness;
mod ocr;
mod ocr_score;
mod registry;
mod shapes;
mod vlm;
mod vlm_native;

use std::collections::BTreeMap;

pub use flowtune_models::Waveform;

pub use brightness::{mean_luma, Brightness};
pub use clip::{
    clip_score, cosine, pickscore, ClipKind, ClipReward, ClipSettings, PICKSCORE_DIVISOR,
};
pub use config::{OnError, RewardConfig, RewardFunction};
pub use frames::{frame, PerFrame};
pub use hpsv3::{Hpsv3, Hpsv3Settings, HPSV3_PROMPT};
pub use http::{HttpReward, HttpSettings};
pub use jpeg::JpegSize;
pub use loudness::{level_dbfs, Loudness, LoudnessSettings};
pub use ocr::{Line, OcrReward, OcrSettings, Reader};
pub use ocr_score::ocr_score;
pub use registry::{build, build_on, validate, REWARD_NAMES};
pub use shapes::ShapesGeneval;
pub use vlm::{JudgeBackend, JudgeMode, VlmJudge, VlmSettings};
pub use vlm_native::NativeJudge;

/// An RGB image, row-major u8 (H × W × 3).
pub type RgbImage = image::RgbImage;

/// One sample to score: a picture, or a video clip as its frames side by side.
#[derive(Clone, Copy)]
pub struct Sample<'a> {
    pub image: &'a RgbImage,
    /// How many frames lie side by side in `image` (1 for a picture).
    pub frames: usize,
    /// The sample's sound, for a family with an audio stream (LTX-2).
    pub audio: Option<&'a Waveform>,
    pub prompt: &'a str,
    /// The target the prompt asks for (e.g. the quoted text of an OCR prompt).
    pub ground_truth: Option<&'a str>,
    pub data_source: &'a str,
    pub extra_info: &'a serde_json::Value,
}

/// A sample's score and named extras (logged as `critic/<name>/mean`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Score {
    pub value: f64,
    pub extras: BTreeMap<String, f64>,
}

/// Why scoring failed.
#[derive(Debug, thiserror::Error)]
pub enum RewardError {
    #[error("reward `{reward}`: {message}")]
    Failed { reward: String, message: String },
    #[error("reward config: {0}")]
    Config(String),
}

/// A scorer of samples.
pub trait Reward: Send + Sync {
    /// The registry name (`jpeg_compressibility`, …).
    fn name(&self) -> &str;
    /// One score per sample, in order; an error fails the whole batch.
    fn score(&self, samples: &[Sample<'_>]) -> Result<Vec<Score>, RewardError>;
}

/// A scorer and its weight in the total.
pub type Weighted = (Box<dyn Reward>, f64);

/// What the scorers said about one sample: each scorer's finite value by name, and the extras.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct SampleScores {
    pub by_scorer: BTreeMap<String, f64>,
    pub extras: BTreeMap<String, f64>,
}

/// The combined scores of a batch.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScoredBatch {
    /// Weighted total per sample; `None` for a sample dropped under `on_error: skip_sample`.
    pub totals: Vec<Option<f64>>,
    /// Per sample, what each scorer returned.
    pub details: Vec<SampleScores>,
    /// Scorers whose whole call failed (tolerated under `skip_sample`).
    pub failed_scorers: usize,
    /// Scorer failures tolerated under `skip_sample`, for the log.
    pub errors: Vec<String>,
}

impl ScoredBatch {
    /// `critic/<name>/mean` per scorer and extra (over the samples that have it),
    /// `critic/rewards/skipped` and `critic/rewards/failed_scorers`.
    pub fn metrics(&self) -> BTreeMap<String, f64> {
        let mut sums: BTreeMap<String, (f64, usize)> = BTreeMap::new();
        for d in &self.details {
            for (k, v) in d.by_scorer.iter().chain(&d.extras) {
                let e = sums.entry(format!("critic/{k}/mean")).or_default();
                e.0 += v;
                e.1 += 1;
            }
        }
        let mut metrics: BTreeMap<String, f64> =
            sums.into_iter().map(|(k, (s, n))| (k, s / n as f64)).collect();
        let skipped = self.totals.iter().filter(|t| t.is_none()).count();
        metrics.insert("critic/rewards/skipped".into(), skipped as f64);
        metrics.insert("critic/rewards/failed_scorers".into(), self.failed_scorers as f64);
        metrics
    }

    /// The batches one after the other, as if scored together (a scorer that failed on any of
    /// them counts once per batch).
    pub fn concat(parts: Vec<ScoredBatch>) -> ScoredBatch {
        let mut out =
            ScoredBatch { totals: vec![], details: vec![], failed_scorers: 0, errors: vec![] };
        for p in parts {
            out.totals.extend(p.totals);
            out.details.extend(p.details);
            out.failed_scorers += p.failed_scorers;
            out.errors.extend(p.errors);
        }
        out
    }
}

/// Scores `samples` with every weighted scorer and sums them, applying `on_error`.
pub fn score_batch(
    scorers: &[(Box<dyn Reward>, f64)],
    samples: &[Sample<'_>],
    on_error: OnError,
) -> Result<ScoredBatch, RewardError> {
    let mut totals: Vec<Option<f64>> = vec![Some(0.0); samples.len()];
    let mut details = vec![SampleScores::default(); samples.len()];
    let mut failed_scorers = 0;
    let mut errors = vec![];
    for (scorer, weight) in scorers {
        let scores = match scorer.score(samples) {
            Ok(s) if s.len() == samples.len() => s,
            Ok(s) => {
                return Err(RewardError::Failed {
                    reward: scorer.name().into(),
                    message: format!("returned {} scores for {} samples", s.len(), samples.len()),
                })
            }
            Err(e) if on_error == OnError::SkipSample => {
                // A batch-level failure touches every sample of the batch.
                totals.iter_mut().for_each(|t| *t = None);
                failed_scorers += 1;
                errors.push(e.to_string());
                continue;
            }
            Err(e) => return Err(e),
        };
        for (i, score) in scores.into_iter().enumerate() {
            if !score.value.is_finite() {
                if on_error == OnError::SkipSample {
                    totals[i] = None;
                    continue;
                }
                return Err(RewardError::Failed {
                    reward: scorer.name().into(),
                    message: format!("score {} for sample {i} (prompt {:?}); set reward.on_error: skip_sample to drop such samples", score.value, samples[i].prompt),
                });
            }
            if let Some(t) = totals[i].as_mut() {
                *t += weight * score.value;
            }
            details[i].by_scorer.insert(scorer.name().to_string(), score.value);
            details[i].extras.extend(score.extras);
        }
    }
    Ok(ScoredBatch { totals, details, failed_scorers, errors })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat() -> RgbImage {
        RgbImage::from_pixel(32, 32, image::Rgb([120, 30, 200]))
    }

    fn noisy() -> RgbImage {
        let mut state = 12345u32;
        RgbImage::from_fn(32, 32, |_, _| {
            let mut next = || {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 24) as u8
            };
            image::Rgb([next(), next(), next()])
        })
    }

    fn sample(image: &RgbImage) -> Sample<'_> {
        Sample {
            image,
            frames: 1,
            audio: None,
            prompt: "a cat",
            ground_truth: None,
            data_source: "test",
            extra_info: &serde_json::Value::Null,
        }
    }

    /// A scorer returning fixed values, or failing.
    struct Fixed(Vec<f64>, bool);

    impl Reward for Fixed {
        fn name(&self) -> &str {
            "fixed"
        }
        fn score(&self, _: &[Sample<'_>]) -> Result<Vec<Score>, RewardError> {
            if self.1 {
                return Err(RewardError::Failed {
                    reward: "fixed".into(),
                    message: "server down".into(),
                });
            }
            Ok(self.0.iter().map(|&value| Score { value, ..Default::default() }).collect())
        }
    }

    #[test]
    fn jpeg_rewards_order_flat_and_noisy_images() {
        let (flat, noisy) = (flat(), noisy());
        let samples = [sample(&flat), sample(&noisy)];
        let small = JpegSize { compressible: true }.score(&samples).unwrap();
        let big = JpegSize { compressible: false }.score(&samples).unwrap();
        assert!(small[0].value > small[1].value, "flat images compress better: {small:?}");
        assert!(big[1].value > big[0].value);
        assert!((small[1].value + big[1].value / 500.0).abs() < 1e-12, "compressibility = −kB/500");
    }

    #[test]
    fn weighted_scorers_sum_and_report_means() {
        let img = flat();
        let samples = [sample(&img), sample(&img)];
        let scorers: Vec<Weighted> = vec![
            (Box::new(Fixed(vec![1.0, 3.0], false)), 0.5),
            (Box::new(Fixed(vec![2.0, 2.0], false)), 2.0),
        ];
        let out = score_batch(&scorers, &samples, OnError::Fail).unwrap();
        assert_eq!(out.totals, [Some(4.5), Some(5.5)]);
        assert_eq!(out.metrics()["critic/fixed/mean"], 2.0);
        assert_eq!(out.metrics()["critic/rewards/skipped"], 0.0);
    }

    #[test]
    fn nan_and_failures_fail_or_skip_never_zero() {
        let img = flat();
        let samples = [sample(&img), sample(&img)];
        let nan: Vec<Weighted> = vec![(Box::new(Fixed(vec![1.0, f64::NAN], false)), 1.0)];
        let err = score_batch(&nan, &samples, OnError::Fail).unwrap_err().to_string();
        assert!(
            err.contains("reward `fixed`: score NaN for sample 1 (prompt \"a cat\")")
                && err.contains("skip_sample"),
            "{err}"
        );
        let out = score_batch(&nan, &samples, OnError::SkipSample).unwrap();
        assert_eq!(out.totals, [Some(1.0), None]);
        assert_eq!(out.metrics()["critic/rewards/skipped"], 1.0);
        let down: Vec<Weighted> = vec![(Box::new(Fixed(vec![], true)), 1.0)];
        assert!(score_batch(&down, &samples, OnError::Fail)
            .unwrap_err()
            .to_string()
            .contains("server down"));
        let out = score_batch(&down, &samples, OnError::SkipSample).unwrap();
        assert_eq!(out.totals, [None, None]);
        assert_eq!(out.metrics()["critic/rewards/failed_scorers"], 1.0);
        assert!(out.errors[0].contains("server down"), "the error is kept for the log");
    }

    #[test]
    fn unknown_reward_lists_known_ones() {
        let config =
            RewardConfig { functions: vec![RewardFunction::named("hpsv2")], ..Default::default() };
        let err = build(&config).err().unwrap().to_string();
        assert!(
            err.contains(
                "unknown reward `hpsv2`; known: jpeg_compressibility, jpeg_incompressibility, brightness, http, shapes_geneval, vlm_judge, ocr, clip_score, pickscore, aesthetic, hpsv3"
            ),
            "{err}"
        );
        // A CLIP reward without its weights says what it needs.
        let config = RewardConfig {
            functions: vec![RewardFunction::named("aesthetic")],
            ..Default::default()
        };
        let err = build(&config).err().unwrap().to_string();
        assert!(err.contains("needs `clip: {model:"), "{err}");
    }
}
