//! `loudness`: how near a sample's sound is to a target level. Its level is the RMS over every
//! sample of every channel in dBFS, `L = 10·log10(mean(x²))` (floored at −120 dB: silence), and the
//! score `exp(−½·((L − target)/width)²)`: 1 at the target, 0.61 one `width` away, near 0 for
//! silence. Smooth in the samples, so a last-bit difference in the sound stays one in the score
//! (the reward for checking that two runs of a family with sound are the same computation), and
//! useful alone: it pulls quiet or clipped clips to a chosen level.

use serde::{Deserialize, Serialize};

use crate::{Reward, RewardError, Sample, Score};

/// The level `loudness` aims at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LoudnessSettings {
    /// The level that scores 1, in dBFS (0 is a full-scale square wave).
    pub target_dbfs: f64,
    /// How far from the target, in dB, the score falls to exp(−½) ≈ 0.61.
    pub width_db: f64,
}

impl Default for LoudnessSettings {
    fn default() -> Self {
        Self { target_dbfs: -20.0, width_db: 6.0 }
    }
}

impl LoudnessSettings {
    /// A finite target and a positive width, or an error naming the key.
    pub fn check(&self) -> Result<(), RewardError> {
        if !self.target_dbfs.is_finite() {
            return Err(RewardError::Config(format!(
                "reward `loudness`: target_dbfs {} is not finite",
                self.target_dbfs
            )));
        }
        if !(self.width_db.is_finite() && self.width_db > 0.0) {
            return Err(RewardError::Config(format!(
                "reward `loudness`: width_db must be > 0, got {}",
                self.width_db
            )));
        }
        Ok(())
    }
}

/// The lowest level, in dBFS, a sound is given: what silence measures.
const FLOOR_DBFS: f64 = -120.0;

/// RMS level in dBFS of a mean square.
pub fn level_dbfs(mean_square: f64) -> f64 {
    (10.0 * mean_square.log10()).max(FLOOR_DBFS)
}

/// The loudness scorer.
pub struct Loudness(pub LoudnessSettings);

impl Reward for Loudness {
    fn name(&self) -> &str {
        "loudness"
    }

    fn score(&self, samples: &[Sample<'_>]) -> Result<Vec<Score>, RewardError> {
        let LoudnessSettings { target_dbfs, width_db } = self.0;
        samples
            .iter()
            .map(|s| {
                let audio = s.audio.ok_or_else(|| RewardError::Failed {
                    reward: "loudness".into(),
                    message: "the samples have no sound: loudness scores a family with an audio \
                              stream (LTX-2)"
                        .into(),
                })?;
                let level = level_dbfs(audio.mean_square());
                let z = (level - target_dbfs) / width_db;
                let mut score = Score { value: (-0.5 * z * z).exp(), ..Default::default() };
                score.extras.insert("loudness_dbfs".into(), level);
                Ok(score)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Waveform;

    fn sample<'a>(image: &'a crate::RgbImage, audio: Option<&'a Waveform>) -> Sample<'a> {
        Sample {
            image,
            frames: 1,
            audio,
            prompt: "a bell",
            ground_truth: None,
            data_source: "t",
            extra_info: &serde_json::Value::Null,
        }
    }

    #[test]
    fn the_target_level_scores_one_and_silence_near_zero() {
        let image = crate::RgbImage::new(2, 2);
        // A full-scale square wave is 0 dBFS; at amplitude 0.1 it is −20 dBFS.
        let square = |a: f32| Waveform { channels: vec![vec![a, -a, a, -a]; 2], sample_rate: 8 };
        let (at, above, silent) = (square(0.1), square(0.2), square(0.0));
        let reward = Loudness(LoudnessSettings::default());
        let scores = reward
            .score(&[
                sample(&image, Some(&at)),
                sample(&image, Some(&above)),
                sample(&image, Some(&silent)),
            ])
            .unwrap();
        assert!((scores[0].value - 1.0).abs() < 1e-12);
        assert!((scores[0].extras["loudness_dbfs"] + 20.0).abs() < 1e-6);
        // 20·log10(2) = 6.02 dB louder: one width away, exp(−½·(6.02/6)²).
        let z = 20.0 * 2f64.log10() / 6.0;
        assert!((scores[1].value - (-0.5 * z * z).exp()).abs() < 1e-6, "{}", scores[1].value);
        assert_eq!(scores[2].extras["loudness_dbfs"], FLOOR_DBFS);
        assert!(scores[2].value < 1e-40);
        let err = reward.score(&[sample(&image, None)]).unwrap_err().to_string();
        assert!(err.contains("no sound"), "{err}");
        assert!(LoudnessSettings { width_db: 0.0, ..Default::default() }.check().is_err());
    }
}
