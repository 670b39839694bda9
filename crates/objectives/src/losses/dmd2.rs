//! DMD2's distribution matching (`docs/spec/algorithms.md` §9): the few-step student's sigma
//! grid, the noise levels its samples are scored at, the teacher's guidance, the
//! distribution-matching gradient and its surrogate loss, and the fake score's denoising loss.
//! Everything in f32, as the reference computes it whatever the transformer's dtype.

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::{batch_rows, same_shape, scalar, LossOutput, Metrics};
use crate::ObjectiveError;

/// `actor.dmd2`: DMD2 (VeRL-Omni's `dmd.*` settings and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Dmd2Config {
    /// Denoising steps of the student (its sigmas: `student_shift` applied to `linspace(1, 0,
    /// student_steps + 1)`, [1, 0.9, 0.75, 0.5, 0] by default).
    pub student_steps: usize,
    /// The shift `s·σ / (1 + (s − 1)·σ)` of the student's grid.
    pub student_shift: f64,
    /// Fake-score updates after each student update (each on fresh prompts).
    pub fake_update_ratio: usize,
    /// The fake score's learning rate (constant).
    pub fake_lr: f64,
    /// The fake score's AdamW weight decay (its betas, ε and clipping are `trainer`'s).
    pub fake_weight_decay: f64,
    /// The teacher's classifier-free guidance scale (the base model, adapters off).
    pub teacher_guidance_scale: f64,
    /// How the teacher's guided velocity is rescaled.
    pub cfg_norm: CfgNorm,
    /// The normaliser's floor ε in `g = (x_fake − x_real) / max(mean|x − x_real|, ε)`.
    pub normalization_epsilon: f64,
    /// Scored noise levels: `t` uniform over this many training timesteps (0: `σ` uniform in
    /// `[score_sigma_min, score_sigma_max]`).
    pub score_discrete_steps: usize,
    /// The shift of the scored noise levels `σ = s·f / (1 + (s − 1)·f)`, `f = t / steps`.
    pub score_shift: f64,
    /// The lowest scored noise level (levels are clamped to `[score_sigma_min, score_sigma_max]`).
    pub score_sigma_min: f64,
    /// The highest scored noise level.
    pub score_sigma_max: f64,
}

impl Default for Dmd2Config {
    fn default() -> Self {
        Self {
            student_steps: 4,
            student_shift: 3.0,
            fake_update_ratio: 2,
            fake_lr: 2e-5,
            fake_weight_decay: 1e-3,
            teacher_guidance_scale: 4.0,
            cfg_norm: CfgNorm::LayerNorm,
            normalization_epsilon: 1e-6,
            score_discrete_steps: 1000,
            score_shift: 3.0,
            score_sigma_min: 0.02,
            score_sigma_max: 0.98,
        }
    }
}

/// The rescaling of the teacher's guided velocity.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum CfgNorm {
    /// `u + s·(c − u)` as it is.
    None,
    /// Scaled back, token by token, to the norm of the conditional velocity over the token's
    /// channels (`‖c‖ / max(‖guided‖, 1e-12)`; Qwen-Image's true-CFG rescale).
    #[default]
    LayerNorm,
}

impl Dmd2Config {
    /// Checks ranges; the error names the key, the value and what is allowed.
    pub fn validate(&self) -> Result<(), ObjectiveError> {
        if self.student_steps == 0 {
            return Err(ObjectiveError::invalid("dmd2.student_steps", 0, "≥ 1"));
        }
        if self.fake_update_ratio == 0 {
            return Err(ObjectiveError::invalid(
                "dmd2.fake_update_ratio",
                0,
                "≥ 1 (the fake score must follow the student)",
            ));
        }
        for (key, shift) in
            [("dmd2.student_shift", self.student_shift), ("dmd2.score_shift", self.score_shift)]
        {
            if !(shift >= 1.0 && shift.is_finite()) {
                return Err(ObjectiveError::invalid(key, shift, "a finite number ≥ 1"));
            }
        }
        let positive = [
            ("dmd2.fake_lr", self.fake_lr),
            ("dmd2.teacher_guidance_scale", self.teacher_guidance_scale),
            ("dmd2.normalization_epsilon", self.normalization_epsilon),
        ];
        for (key, value) in positive {
            if !(value > 0.0 && value.is_finite()) {
                return Err(ObjectiveError::invalid(key, value, "a finite number > 0"));
            }
        }
        if !(self.fake_weight_decay >= 0.0 && self.fake_weight_decay.is_finite()) {
            let wd = self.fake_weight_decay;
            return Err(ObjectiveError::invalid(
                "dmd2.fake_weight_decay",
                wd,
                "a finite number ≥ 0",
            ));
        }
        let (lo, hi) = (self.score_sigma_min, self.score_sigma_max);
        if !(0.0 < lo && lo < hi && hi <= 1.0) {
            return Err(ObjectiveError::invalid(
                "dmd2.score_sigma_min / score_sigma_max",
                format!("[{lo}, {hi}]"),
                "0 < min < max ≤ 1",
            ));
        }
        Ok(())
    }

    /// The student's N + 1 sigmas, from 1 down to 0, computed in f32 as the reference does:
    /// `s·x / (1 + (s − 1)·x)` over `linspace(1, 0, N + 1)`.
    pub fn student_sigmas(&self) -> Vec<f32> {
        let steps = self.student_steps as i64 + 1;
        let x = Tensor::linspace(1.0, 0.0, steps, (Kind::Float, Device::Cpu));
        let s = self.student_shift;
        let shifted = &x * s / (&x * (s - 1.0) + 1.0);
        Vec::<f32>::try_from(shifted).expect("f32 sigmas")
    }

    /// The scored noise level of a draw `u` uniform in [0, 1): `t = ⌊u·T⌋` of the T discrete
    /// training timesteps, `σ = shift(t / T)` clamped to `[min, max]` (or, with no discrete
    /// steps, `σ = min + u·(max − min)`), in f32.
    pub fn score_sigma(&self, u: f64) -> f32 {
        let (lo, hi) = (self.score_sigma_min as f32, self.score_sigma_max as f32);
        match self.score_discrete_steps {
            0 => lo + u as f32 * (hi - lo),
            steps => {
                // As the reference's f32 `timestep_shift(t, T, s) / T`.
                let total = steps as f32;
                let t = ((u * steps as f64) as usize).min(steps - 1) as f32;
                let f = t / total;
                let s = self.score_shift as f32;
                (s * f / (1.0 + (s - 1.0) * f) * total / total).clamp(lo, hi)
            }
        }
    }
}

/// `u + s·(c − u)` in f32, rescaled per token to `‖c‖ / max(‖guided‖, 1e-12)` over `dims` with
/// [`CfgNorm::LayerNorm`].
pub fn teacher_guidance(
    cond: &Tensor,
    uncond: &Tensor,
    scale: f64,
    norm: CfgNorm,
    dims: &[i64],
) -> Tensor {
    let (cond, uncond) = (cond.to_kind(Kind::Float), uncond.to_kind(Kind::Float));
    let guided = &uncond + (&cond - &uncond) * scale;
    match norm {
        CfgNorm::None => guided,
        CfgNorm::LayerNorm => {
            let size = |t: &Tensor| t.norm_scalaropt_dim(2, dims, true);
            let ratio = size(&cond) / size(&guided).clamp_min(1e-12);
            guided * ratio
        }
    }
}

/// The distribution-matching gradient at a student sample `x` (B, …) from the fake and real
/// (teacher) clean predictions at its re-noised copy: `g = (x_fake − x_real) / Z` with the
/// per-row normaliser `Z = max(mean|x − x_real|, ε)`, non-finite values of `g` made finite as
/// `torch.nan_to_num` does. Returns `g`, `Z` (B,) and how many values of `g` were not finite.
pub fn dmd_gradient(
    x_fake: &Tensor,
    x_real: &Tensor,
    x: &Tensor,
    epsilon: f64,
) -> Result<(Tensor, Tensor, i64), ObjectiveError> {
    same_shape(&[("x", x), ("x_fake", x_fake), ("x_real", x_real)])?;
    batch_rows(x, "x")?;
    let _guard = tch::no_grad_guard();
    let f32 = |t: &Tensor| t.detach().to_kind(Kind::Float);
    let (x_fake, x_real, x) = (f32(x_fake), f32(x_real), f32(x));
    let dims: Vec<i64> = (1..x.dim() as i64).collect();
    let z = (&x - &x_real).abs().mean_dim(dims.as_slice(), true, Kind::Float).clamp_min(epsilon);
    let g = (&x_fake - &x_real) / &z;
    let nonfinite = g.isfinite().logical_not().sum(Kind::Int64).int64_value(&[]);
    let g = g.nan_to_num(0.0, None, None);
    Ok((g, z.flatten(0, -1), nonfinite))
}

/// DMD2's surrogate loss `0.5·mean((x − sg(x − g))²)` over every element of the student's clean
/// prediction `x` (with gradient), whose gradient is `g / numel`. Metrics: `dmd/loss`,
/// `dmd/normalizer` (the mean `Z`), `dmd/gradient_norm` (the mean per-row ‖g‖) and
/// `dmd/nonfinite` (non-finite values of `g` per row).
pub fn dmd_loss(
    x: &Tensor,
    g: &Tensor,
    normalizer: &Tensor,
    nonfinite: i64,
) -> Result<LossOutput, ObjectiveError> {
    same_shape(&[("x", x), ("g", g)])?;
    let rows = batch_rows(x, "x")?;
    let x = x.to_kind(Kind::Float);
    let target = (&x - g).detach();
    let loss = (&x - &target).square().mean(Kind::Float) * 0.5;
    let row_norms = g.flatten(1, -1).norm_scalaropt_dim(2, [1], false);
    let metrics = Metrics::from([
        ("dmd/loss".to_string(), scalar(&loss)?),
        ("dmd/normalizer".to_string(), scalar(&normalizer.mean(Kind::Float))?),
        ("dmd/gradient_norm".to_string(), scalar(&row_norms.mean(Kind::Float))?),
        ("dmd/nonfinite".to_string(), nonfinite as f64 / rows as f64),
    ]);
    Ok(LossOutput { loss, metrics })
}

/// The fake score's denoising loss `mean((v − sg(ε − x))²)` of its velocity `v` (with gradient)
/// at `(1 − σ)·x + σ·ε` of the student's sample `x`, over every element. Metric:
/// `fake_score/loss`.
pub fn fake_score_loss(
    velocity: &Tensor,
    noise: &Tensor,
    x: &Tensor,
) -> Result<LossOutput, ObjectiveError> {
    same_shape(&[("velocity", velocity), ("noise", noise), ("x", x)])?;
    let target = (noise.to_kind(Kind::Float) - x.to_kind(Kind::Float)).detach();
    let loss = (velocity.to_kind(Kind::Float) - target).square().mean(Kind::Float);
    let metrics = Metrics::from([("fake_score/loss".to_string(), scalar(&loss)?)]);
    Ok(LossOutput { loss, metrics })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_student_grid_is_the_references() {
        let sigmas = Dmd2Config::default().student_sigmas();
        assert_eq!(sigmas, vec![1.0, 0.9, 0.75, 0.5, 0.0]);
    }

    #[test]
    fn scored_noise_levels_are_shifted_and_clamped() {
        let c = Dmd2Config::default();
        assert_eq!(c.score_sigma(0.0), 0.02);
        assert_eq!(c.score_sigma(0.9999), 0.98);
        // t = 500: 3·0.5 / 2 = 0.75.
        assert_eq!(c.score_sigma(0.5), 0.75);
        let uniform = Dmd2Config { score_discrete_steps: 0, ..c };
        assert!((uniform.score_sigma(0.5) - 0.5).abs() < 1e-7);
    }

    /// The reference's own example: student [[1, 3], [4, 8]], teacher 0, fake 1.
    #[test]
    fn the_gradient_is_the_references_example() {
        let x = Tensor::from_slice(&[1.0f32, 3.0, 4.0, 8.0]).view([2, 2]).set_requires_grad(true);
        let (real, fake) = (x.zeros_like().detach(), x.ones_like().detach());
        let (g, z, bad) = dmd_gradient(&fake, &real, &x, 1e-6).unwrap();
        assert_eq!(Vec::<f32>::try_from(z).unwrap(), vec![2.0, 6.0]);
        assert_eq!(bad, 0);
        let out = dmd_loss(&x, &g, &Tensor::from_slice(&[2.0f32, 6.0]), bad).unwrap();
        out.loss.backward();
        let want = [0.5f32 / 4.0, 0.5 / 4.0, 1.0 / 6.0 / 4.0, 1.0 / 6.0 / 4.0];
        let grad = Vec::<f32>::try_from(x.grad().flatten(0, -1)).unwrap();
        assert!(grad.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-7), "{grad:?}");
    }

    #[test]
    fn non_finite_gradients_are_counted_and_zeroed() {
        let x = Tensor::zeros([1, 2], (Kind::Float, Device::Cpu));
        let fake = Tensor::from_slice(&[f32::NAN, 1.0]).view([1, 2]);
        let (g, _, bad) = dmd_gradient(&fake, &x, &x, 0.5).unwrap();
        assert_eq!(bad, 1);
        assert_eq!(Vec::<f32>::try_from(g.flatten(0, -1)).unwrap(), vec![0.0, 2.0]);
    }
}
