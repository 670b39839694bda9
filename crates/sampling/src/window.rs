//! SDE windows (`docs/spec/algorithms.md` §3): which denoising steps of a rollout are
//! stochastic and trained. Outside the window the sampler takes plain Euler (ODE) steps.

use std::ops::Range;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::noise::SampleRng;
use crate::{SamplerConfig, SamplingError, WindowStrategy};

impl SamplerConfig {
    /// Checks the window against a rollout of `steps` denoising steps; returns `[lo, hi)`.
    pub fn window_range(&self, steps: usize) -> Result<Range<usize>, SamplingError> {
        let [lo, hi] = self.sde_window_range.unwrap_or([0, steps.saturating_sub(1)]);
        if lo >= hi || hi > steps {
            return Err(SamplingError::setting(
                "sde_window_range",
                format!("[{lo}, {hi}]"),
                format!("lo < hi ≤ steps ({steps})"),
            ));
        }
        if self.sde_window_size > hi - lo {
            return Err(SamplingError::setting(
                "sde_window_size",
                self.sde_window_size,
                format!("at most the {} steps of sde_window_range [{lo}, {hi}]", hi - lo),
            ));
        }
        if self.sde_window_strategy == WindowStrategy::Progressive && self.iters_per_group == 0 {
            return Err(SamplingError::setting("iters_per_group", 0, "≥ 1"));
        }
        Ok(lo..hi)
    }

    /// Whether a window start is drawn from each sample's own RNG (so it consumes a draw there).
    pub fn window_per_sample(&self) -> bool {
        self.sde_window_size > 0
            && self.sde_window_strategy == WindowStrategy::Random
            && self.sde_window_seed.is_none()
    }

    /// The stochastic steps of one sample at training step `step` (1-based) of a rollout with
    /// `steps` denoising steps. `rng` is the sample's stream, drawn from only when
    /// [`Self::window_per_sample`] holds.
    pub fn draw_window(
        &self,
        steps: usize,
        step: u64,
        rng: &mut SampleRng,
    ) -> Result<Range<usize>, SamplingError> {
        let range = self.window_range(steps)?;
        let w = self.sde_window_size;
        if w == 0 {
            return Ok(0..steps.saturating_sub(1));
        }
        let last_start = range.end - w;
        let start = match (self.sde_window_strategy, self.sde_window_seed) {
            (WindowStrategy::Random, None) => rng.uniform_int(range.start, last_start),
            (WindowStrategy::Random, Some(seed)) => {
                ChaCha8Rng::seed_from_u64(seed.wrapping_add(step))
                    .random_range(range.start..=last_start)
            }
            (WindowStrategy::Progressive, _) => {
                let shifted = range.start as u64 + (step / self.iters_per_group) * w as u64;
                shifted.min(last_start as u64) as usize
            }
        };
        Ok(start..start + w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(size: usize, strategy: WindowStrategy) -> SamplerConfig {
        SamplerConfig {
            sde_window_size: size,
            sde_window_range: Some([0, 8]),
            sde_window_strategy: strategy,
            iters_per_group: 2,
            ..Default::default()
        }
    }

    #[test]
    fn no_window_trains_all_but_last() {
        let w = SamplerConfig::default();
        assert_eq!(w.draw_window(10, 1, &mut SampleRng::new(0)).unwrap(), 0..9);
    }

    #[test]
    fn progressive_slides_then_clamps() {
        let w = window(3, WindowStrategy::Progressive);
        let starts: Vec<usize> =
            (0..12).map(|k| w.draw_window(10, k, &mut SampleRng::new(0)).unwrap().start).collect();
        // ⌊k/2⌋·3, clamped at hi − W = 5.
        assert_eq!(starts, [0, 0, 3, 3, 5, 5, 5, 5, 5, 5, 5, 5]);
    }

    #[test]
    fn random_windows_stay_in_range_and_cover_it() {
        let w = window(2, WindowStrategy::Random);
        let mut seen = [false; 7];
        for s in 0..200 {
            let r = w.draw_window(10, 1, &mut SampleRng::new(s)).unwrap();
            assert!(r.end <= 8 && r.len() == 2);
            seen[r.start] = true;
        }
        assert!(seen.iter().all(|&x| x), "every start 0..=6 drawn: {seen:?}");
    }

    #[test]
    fn seeded_window_is_shared_by_the_batch() {
        let w = SamplerConfig { sde_window_seed: Some(9), ..window(2, WindowStrategy::Random) };
        let a = w.draw_window(10, 4, &mut SampleRng::new(1)).unwrap();
        let b = w.draw_window(10, 4, &mut SampleRng::new(2)).unwrap();
        assert_eq!(a, b);
        let starts: std::collections::HashSet<usize> =
            (1..40).map(|k| w.draw_window(10, k, &mut SampleRng::new(0)).unwrap().start).collect();
        assert!(starts.len() > 1, "the start moves between training steps");
    }

    #[test]
    fn oversized_window_is_rejected() {
        let w = window(9, WindowStrategy::Random);
        let err = w.window_range(10).unwrap_err().to_string();
        assert!(err.contains("sde_window_size: 9"), "{err}");
    }
}
