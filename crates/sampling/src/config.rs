//! The recipe's `rollout` section: how samples are drawn, with the reference framework's names.

use serde::{Deserialize, Serialize};

use crate::step::{SdeType, StepParams};
use crate::SamplingError;

/// Sampler settings; defaults are the public Flow-GRPO SD3.5-M recipe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SamplerConfig {
    /// Samples per prompt (the GRPO group size).
    pub n: usize,
    /// Rows sampled per model batch (0: all rows of a step at once), independent of `n`; `auto`:
    /// the largest the plan fits in the device's memory (`trainer.auto_memory_gib`).
    pub batch_size: usize,
    /// Denoising steps of a training rollout.
    pub steps: usize,
    /// Denoising steps of a validation rollout (η = 0).
    pub eval_steps: usize,
    /// Classifier-free guidance scale, diffusers' number for the family; whether CFG runs at it
    /// is the family's rule (`Denoiser::runs_cfg`: `> 1`, Z-Image `> 0`).
    pub guidance_scale: f64,
    /// The CFG scale of the low-noise expert's steps, for two-expert pipelines (Wan2.2-A14B's
    /// `guidance_scale_2`); unset: `guidance_scale`. Whether CFG runs follows `guidance_scale` alone, as in diffusers.
    pub guidance_scale_2: Option<f64>,
    pub sde_type: SdeType,
    /// Noise level η inside the SDE window.
    pub noise_level: f64,
    /// Include the Gaussian normaliser in step log-probs.
    pub log_prob_normalizer: bool,
    /// Steps in the SDE window W; 0 = no window (every step but the last is stochastic).
    pub sde_window_size: usize,
    /// `[lo, hi)` the window lies in; default `[0, steps − 1]`.
    pub sde_window_range: Option<[usize; 2]>,
    pub sde_window_strategy: WindowStrategy,
    /// With `random`: one start per training step for the whole batch, seeded `sde_window_seed + step`.
    pub sde_window_seed: Option<u64>,
    /// With `progressive`: training steps per window position.
    pub iters_per_group: u64,
    /// Rows of one prompt (a group) start from the same initial noise, the first row's
    /// (DanceGRPO's `use_same_noise`): their rewards then differ only through the SDE steps the
    /// policy gradient credits. Step noise and windows stay per row.
    pub same_noise: bool,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            n: 24,
            batch_size: 16,
            steps: 10,
            eval_steps: 40,
            guidance_scale: 4.5,
            guidance_scale_2: None,
            sde_type: SdeType::Sde,
            noise_level: 0.7,
            log_prob_normalizer: true,
            sde_window_size: 0,
            sde_window_range: None,
            sde_window_strategy: WindowStrategy::Random,
            sde_window_seed: None,
            iters_per_group: 25,
            same_noise: false,
        }
    }
}

impl SamplerConfig {
    /// Checks every setting; the error names the key, the value and what is allowed.
    pub fn validate(&self) -> Result<(), SamplingError> {
        if !(self.noise_level >= 0.0 && self.noise_level.is_finite()) {
            return Err(SamplingError::setting(
                "noise_level",
                self.noise_level,
                "a finite number ≥ 0",
            ));
        }
        let scales = [
            ("guidance_scale", Some(self.guidance_scale)),
            ("guidance_scale_2", self.guidance_scale_2),
        ];
        for (key, scale) in scales {
            if let Some(scale) = scale.filter(|s| !(*s >= 0.0 && s.is_finite())) {
                return Err(SamplingError::setting(key, scale, "a finite number ≥ 0"));
            }
        }
        for (key, value) in [("n", self.n), ("eval_steps", self.eval_steps)] {
            if value == 0 {
                return Err(SamplingError::setting(key, value, "≥ 1"));
            }
        }
        if self.steps < 2 {
            let why = "≥ 2 (the last step is deterministic, so fewer leave nothing to train)";
            return Err(SamplingError::setting("steps", self.steps, why));
        }
        self.window_range(self.steps).map(|_| ())
    }

    /// The step parameters inside the window, for a grid whose second sigma is `sigma_1`.
    pub fn step_params(&self, sigma_1: f64) -> StepParams {
        StepParams {
            sde_type: self.sde_type,
            noise_level: self.noise_level,
            log_prob_normalizer: self.log_prob_normalizer,
            sigma_1,
        }
    }
}

/// How a window's start is drawn.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum WindowStrategy {
    /// Uniform start; per sample from its own RNG, or, with `sde_window_seed`, one start per
    /// training step shared by the whole batch (MixGRPO).
    #[default]
    Random,
    /// MixGRPO's sliding window: `start = min(lo + ⌊step / iters_per_group⌋·W, hi − W)`.
    Progressive,
}
