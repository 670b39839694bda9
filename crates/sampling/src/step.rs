//! One stochastic reverse step of a flow-matching sampler with the Gaussian log-density of its
//! transition (`docs/spec/algorithms.md` §2): the same function draws a sample in the rollout
//! and scores a stored one in the trainer, so the two log-probs agree to the bit.

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::SamplingError;

/// Which reverse SDE turns the velocity into a stochastic step.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum SdeType {
    /// Flow-GRPO's SDE: `s = η·√(σ/(1−σ))`, noise scaled by `s·√−dt`.
    #[default]
    Sde,
    /// Coefficient-preserving sampling: `s = σ'·sin(ηπ/2)`, log-prob without variance.
    Cps,
    /// DanceGRPO's score-based SDE: `s = η·√(σ−σ')`.
    DanceSde,
}

impl SdeType {
    /// Every SDE type name, as written in recipes.
    pub const NAMES: [&'static str; 3] = ["sde", "cps", "dance_sde"];
}

/// What the step does with its randomness.
pub enum Draw<'a> {
    /// Sample `x' = μ + std·z` from this standard-normal noise (the rollout).
    Noise(&'a Tensor),
    /// Score this given previous sample (the trainer replaying a trajectory).
    Given(&'a Tensor),
}

/// Parameters of one step shared by every row of a batch.
#[derive(Debug, Clone, Copy)]
pub struct StepParams {
    pub sde_type: SdeType,
    /// Noise level η ≥ 0; η = 0 is the deterministic Euler step.
    pub noise_level: f64,
    /// Include `−log(std) − log√(2π)` in the log-density (`sde`, `dance_sde`).
    pub log_prob_normalizer: bool,
    /// The grid's second sigma σ₁, used by `sde` in place of σ = 1 (which would divide by zero).
    pub sigma_1: f64,
}

/// What a reverse step returns; every tensor is f32 (f64 when the inputs are f64).
#[derive(Debug)]
pub struct StepOutput {
    /// The new latent x' (B, …).
    pub prev_sample: Tensor,
    /// Gaussian log-density of `prev_sample`, averaged over the non-batch elements (B,).
    pub log_prob: Tensor,
    /// Mean μ of the transition (B, …), differentiable w.r.t. the model output.
    pub prev_sample_mean: Tensor,
    /// The per-row noise scale `s`, without `√−dt` (B, 1, …).
    pub std_dev_t: Tensor,
    /// `√(σ − σ')` per row (B, 1, …).
    pub sqrt_dt: Tensor,
}

/// The plain Euler step `x + v·(σ' − σ)` used outside the SDE window.
pub fn euler_step(
    sample: &Tensor,
    model_output: &Tensor,
    sigma: &Tensor,
    sigma_next: &Tensor,
) -> Tensor {
    let kind = math_kind(sample);
    let x = sample.to_kind(kind);
    let dt = per_row(&(sigma_next - sigma).to_kind(kind).to_device(x.device()), &x);
    &x + model_output.to_kind(kind) * dt
}

/// One reverse step from σ to σ' (`sigma`, `sigma_next`: per-row, shape (B,)).
///
/// The scheduler math runs in f32 (f64 when `sample` is f64) whatever the model output's dtype.
/// Gradients reach `model_output` through `prev_sample_mean` and `log_prob`; the scored sample
/// itself is detached in the log-density, as in the reference implementation.
pub fn reverse_step(
    params: &StepParams,
    model_output: &Tensor,
    sample: &Tensor,
    sigma: &Tensor,
    sigma_next: &Tensor,
    draw: Draw<'_>,
) -> Result<StepOutput, SamplingError> {
    reverse_step_over(params, model_output, sample, sigma, sigma_next, draw, None)
}

/// [`reverse_step`] whose log-density averages only over the elements where `generated`
/// (broadcastable to the sample, 1 or 0) is 1: the held first frame of image-to-video is no
/// sampled transition and stays out of it.
pub fn reverse_step_over(
    params: &StepParams,
    model_output: &Tensor,
    sample: &Tensor,
    sigma: &Tensor,
    sigma_next: &Tensor,
    draw: Draw<'_>,
    generated: Option<&Tensor>,
) -> Result<StepOutput, SamplingError> {
    let eta = params.noise_level;
    if !(eta >= 0.0 && eta.is_finite()) {
        return Err(SamplingError::setting("noise_level", eta, "a finite number ≥ 0"));
    }
    check_shapes(model_output, sample, sigma, sigma_next, &draw)?;
    let kind = math_kind(sample);
    let x = sample.to_kind(kind);
    let v = model_output.to_kind(kind);
    let sigma = per_row(&sigma.to_kind(kind).to_device(x.device()), &x);
    let sigma_next = per_row(&sigma_next.to_kind(kind).to_device(x.device()), &x);
    let dt = &sigma_next - &sigma;
    let sqrt_dt = (-&dt).sqrt();

    let (mean, std_dev_t, noise_scale) = match params.sde_type {
        SdeType::Sde => {
            let denom_sigma = sigma.where_scalarother(&sigma.ne(1.0), params.sigma_1);
            let one_minus: Tensor = 1.0 - denom_sigma;
            let s = (&sigma / one_minus).sqrt() * eta;
            let s2 = &s * &s;
            let mean = &x * (1.0 + &s2 * &dt / (2.0 * &sigma))
                + &v * (1.0 + &s2 * (1.0 - &sigma) / (2.0 * &sigma)) * &dt;
            let scale = &s * &sqrt_dt;
            (mean, s, scale)
        }
        SdeType::Cps => {
            let s = &sigma_next * (eta * std::f64::consts::FRAC_PI_2).sin();
            let x0 = &x - &sigma * &v;
            let eps = &x + (1.0 - &sigma) * &v;
            let mean =
                x0 * (1.0 - &sigma_next) + eps * (&sigma_next * &sigma_next - &s * &s).sqrt();
            let scale = s.shallow_clone();
            (mean, s, scale)
        }
        SdeType::DanceSde => {
            let x0 = &x - &sigma * &v;
            let residual: Tensor = &x - x0 * (1.0 - &sigma);
            let score = -residual / (&sigma * &sigma);
            let mean = &x + &dt * &v - 0.5 * eta * eta * score * &dt;
            let s = (&sigma - &sigma_next).sqrt() * eta;
            let scale = s.shallow_clone();
            (mean, s, scale)
        }
    };

    let prev_sample = match draw {
        _ if eta == 0.0 => mean.shallow_clone(),
        Draw::Noise(z) => &mean + &noise_scale * z.to_kind(kind),
        Draw::Given(prev) => prev.to_kind(kind),
    };
    let log_prob = if eta == 0.0 {
        // A deterministic step has no density: report 0 (the rollout records only window steps).
        Tensor::zeros([x.size()[0]], (kind, x.device()))
    } else {
        let diff2 = (prev_sample.detach() - &mean).square();
        let per_elem = match params.sde_type {
            SdeType::Cps => -diff2,
            SdeType::Sde | SdeType::DanceSde => {
                let gauss = -diff2 / (2.0 * noise_scale.square());
                if params.log_prob_normalizer {
                    gauss - noise_scale.log() - (2.0 * std::f64::consts::PI).sqrt().ln()
                } else {
                    gauss
                }
            }
        };
        match generated {
            None => mean_over_rows(&per_elem),
            Some(mask) => {
                let mask = mask.to_kind(kind).expand_as(&per_elem);
                mean_over_rows(&(per_elem * &mask)) / mean_over_rows(&mask)
            }
        }
    };
    Ok(StepOutput { prev_sample, log_prob, prev_sample_mean: mean, std_dev_t, sqrt_dt })
}

fn check_shapes(
    model_output: &Tensor,
    sample: &Tensor,
    sigma: &Tensor,
    sigma_next: &Tensor,
    draw: &Draw<'_>,
) -> Result<(), SamplingError> {
    let shape = sample.size();
    let (Draw::Noise(other) | Draw::Given(other)) = draw;
    for (name, t) in [("model_output", model_output), ("noise / given sample", *other)] {
        if t.size() != shape {
            return Err(SamplingError::Invalid(format!(
                "{name} has shape {:?}, the sample has {shape:?}",
                t.size()
            )));
        }
    }
    let rows = shape.first().copied().unwrap_or(1);
    for (name, t) in [("sigma", sigma), ("sigma_next", sigma_next)] {
        if t.numel() as i64 != rows && t.numel() != 1 {
            return Err(SamplingError::Invalid(format!(
                "{name} has {} values for a batch of {rows} rows",
                t.numel()
            )));
        }
    }
    Ok(())
}

fn math_kind(sample: &Tensor) -> Kind {
    if sample.kind() == Kind::Double {
        Kind::Double
    } else {
        Kind::Float
    }
}

/// Reshapes a per-row tensor (B,) (or a scalar) to broadcast against `like` (B, …), whatever the
/// number of latent dimensions (images or video).
pub fn per_row(t: &Tensor, like: &Tensor) -> Tensor {
    let mut shape = vec![-1i64];
    shape.extend(std::iter::repeat_n(1, like.dim().saturating_sub(1)));
    if t.numel() == 1 {
        shape[0] = 1;
    }
    t.reshape(shape)
}

/// Mean over every non-batch dimension: (B, …) → (B,).
pub fn mean_over_rows(t: &Tensor) -> Tensor {
    let dims: Vec<i64> = (1..t.dim() as i64).collect();
    if dims.is_empty() {
        return t.shallow_clone();
    }
    t.mean_dim(dims.as_slice(), false, t.kind())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    const TYPES: [SdeType; 3] = [SdeType::Sde, SdeType::Cps, SdeType::DanceSde];

    fn params(sde_type: SdeType, noise_level: f64) -> StepParams {
        StepParams { sde_type, noise_level, log_prob_normalizer: true, sigma_1: 0.96 }
    }

    fn inputs(kind: Kind) -> (Tensor, Tensor, Tensor, Tensor) {
        tch::manual_seed(3);
        let x = Tensor::randn([2, 3, 4], (kind, Device::Cpu));
        let v = Tensor::randn([2, 3, 4], (kind, Device::Cpu));
        let sigma = Tensor::from_slice(&[1.0f64, 0.7]).to_kind(kind);
        let sigma_next = Tensor::from_slice(&[0.96f64, 0.55]).to_kind(kind);
        (x, v, sigma, sigma_next)
    }

    #[test]
    fn zero_noise_is_the_euler_step() {
        let (x, v, sigma, sigma_next) = inputs(Kind::Float);
        let z = Tensor::randn([2, 3, 4], (Kind::Float, Device::Cpu));
        let euler = euler_step(&x, &v, &sigma, &sigma_next);
        for t in TYPES {
            let out = reverse_step(&params(t, 0.0), &v, &x, &sigma, &sigma_next, Draw::Noise(&z))
                .unwrap();
            let err = (&out.prev_sample - &euler).abs().max().double_value(&[]);
            assert!(err < 1e-6, "{t:?}: η = 0 differs from Euler by {err}");
            assert_eq!(out.log_prob.size(), [2]);
        }
    }

    #[test]
    fn log_prob_gradient_matches_finite_differences() {
        let (x, v, sigma, sigma_next) = inputs(Kind::Double);
        let prev = Tensor::randn([2, 3, 4], (Kind::Double, Device::Cpu)) * 0.1 + &x;
        for t in TYPES {
            let p = params(t, 0.7);
            let f = |v: &Tensor| {
                let out = reverse_step(&p, v, &x, &sigma, &sigma_next, Draw::Given(&prev)).unwrap();
                out.log_prob.sum(Kind::Double)
            };
            let leaf = v.copy().set_requires_grad(true);
            f(&leaf).backward();
            let grad = leaf.grad();
            let h = 1e-6;
            for idx in [0i64, 5, 13, 23] {
                let bump = |d: f64| {
                    let w = v.copy();
                    let _ =
                        w.view([-1]).get(idx).fill_(v.view([-1]).get(idx).double_value(&[]) + d);
                    f(&w).double_value(&[])
                };
                let fd = (bump(h) - bump(-h)) / (2.0 * h);
                let an = grad.view([-1]).get(idx).double_value(&[]);
                assert!(
                    (fd - an).abs() <= 1e-6 * (1.0 + fd.abs()),
                    "{t:?}[{idx}]: autograd {an}, finite difference {fd}"
                );
            }
        }
    }

    /// Masked on the middle row of the second dimension, the log-density is the step's log-density
    /// of the other elements alone (the step is elementwise), whatever the masked elements hold.
    #[test]
    fn masked_log_prob_averages_over_the_generated_elements_only() {
        let (x, v, sigma, sigma_next) = inputs(Kind::Double);
        let prev = Tensor::randn([2, 3, 4], (Kind::Double, Device::Cpu)) * 0.1 + &x;
        let mask = Tensor::from_slice(&[1.0f64, 0.0, 1.0]).view([1, 3, 1]);
        let keep = Tensor::from_slice(&[0i64, 2]);
        let junk = prev.index_fill(1, &Tensor::from_slice(&[1i64]), 1e3);
        for t in TYPES {
            let p = params(t, 0.7);
            let masked =
                reverse_step_over(&p, &v, &x, &sigma, &sigma_next, Draw::Given(&junk), Some(&mask))
                    .unwrap();
            let (vk, xk, pk) =
                (v.index_select(1, &keep), x.index_select(1, &keep), prev.index_select(1, &keep));
            let alone = reverse_step(&p, &vk, &xk, &sigma, &sigma_next, Draw::Given(&pk)).unwrap();
            let err = (&masked.log_prob - &alone.log_prob).abs().max().double_value(&[]);
            assert!(err < 1e-12, "{t:?}: masked log-prob off by {err}");
        }
    }

    #[test]
    fn negative_noise_level_and_bad_shapes_are_errors() {
        let (x, v, sigma, sigma_next) = inputs(Kind::Float);
        let error = |v: &Tensor, eta: f64| {
            let p = params(SdeType::Sde, eta);
            reverse_step(&p, v, &x, &sigma, &sigma_next, Draw::Given(&x)).unwrap_err().to_string()
        };
        let err = error(&v, -0.5);
        assert!(err.contains("noise_level: -0.5 is not allowed"), "{err}");
        let err = error(&v.narrow(2, 0, 2), 0.5);
        assert!(err.contains("model_output has shape [2, 3, 2]"), "{err}");
    }
}
