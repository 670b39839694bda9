//! `brightness`: the mean luma of a picture, 0 (black) to 1 (white), with ITU-R BT.601 weights
//! (0.299 R + 0.587 G + 0.114 B, as PIL's `convert("L")`). A reward smooth in the pixels: one
//! level of one channel moves it by at most 0.587 / (255 · pixels). That makes it the reward for
//! checking that two runs are the same computation (world sizes, sharding, offload, resume), where
//! a last-bit difference in the weights must stay a last-bit difference in the reward, and a
//! seconds-long learning check (weight −1 rewards darker pictures).

use crate::{Reward, RewardError, Sample, Score};

/// The mean-luma scorer.
pub struct Brightness;

/// Mean BT.601 luma of `image` in [0, 1], summed in f64 in pixel order (the same on every CPU).
pub fn mean_luma(image: &image::RgbImage) -> f64 {
    let pixels = image.pixels().len().max(1) as f64;
    let sum: f64 = image
        .pixels()
        .map(|p| 0.299 * p[0] as f64 + 0.587 * p[1] as f64 + 0.114 * p[2] as f64)
        .sum();
    sum / (255.0 * pixels)
}

impl Reward for Brightness {
    fn name(&self) -> &str {
        "brightness"
    }

    fn score(&self, samples: &[Sample<'_>]) -> Result<Vec<Score>, RewardError> {
        Ok(samples
            .iter()
            .map(|s| Score { value: mean_luma(s.image), ..Default::default() })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn black_is_0_white_is_1_and_green_weighs_most() {
        let flat = |rgb: [u8; 3]| image::RgbImage::from_pixel(4, 2, image::Rgb(rgb));
        assert_eq!(mean_luma(&flat([0, 0, 0])), 0.0);
        assert!((mean_luma(&flat([255, 255, 255])) - 1.0).abs() < 1e-12);
        assert!((mean_luma(&flat([0, 255, 0])) - 0.587).abs() < 1e-12);
        // One level of one green value in a 4×2 picture moves the score by 0.587 / (255 · 8).
        let mut one = flat([100, 100, 100]);
        let base = mean_luma(&one);
        one.get_pixel_mut(1, 1)[1] += 1;
        assert!((mean_luma(&one) - base - 0.587 / (255.0 * 8.0)).abs() < 1e-12);
    }
}
