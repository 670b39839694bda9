//! DiffusionNFT (`docs/spec/algorithms.md` §6): a forward-process loss that pulls the
//! policy towards an implicit positive velocity and away from a negative one, weighted by how
//! good each sample was, plus the schedule by which the old (sampling) adapter follows.

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use super::{mean_elems, rows, same_shape, scalar, LossOutput, Metrics};
use crate::ObjectiveError;

/// How clamped advantages `A_c ∈ [−M, M]` become `r = clamp(A′/M/2 + ½, 0, 1)`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum RewardMode {
    /// `A′ = A_c`.
    #[default]
    Continuous,
    /// `A′ = max(A_c, 0)`: worse-than-average samples sit at r = ½.
    PositiveOnly,
    /// `A′ = min(A_c, 0)`: better-than-average samples sit at r = ½.
    NegativeOnly,
    /// `A′ = 1` if `A_c > 0` else 0.
    OneOnly,
    /// `A′ = sign(A_c)`.
    Binary,
}

/// Optimality probabilities `r` (B,) from advantages (B,).
pub fn reward_probability(advantages: &Tensor, mode: RewardMode, adv_clip_max: f64) -> Tensor {
    let a = advantages.clamp(-adv_clip_max, adv_clip_max);
    let shaped = match mode {
        RewardMode::Continuous => a,
        RewardMode::PositiveOnly => a.clamp_min(0.0),
        RewardMode::NegativeOnly => a.clamp_max(0.0),
        RewardMode::OneOnly => a.gt(0.0).to_kind(Kind::Float),
        RewardMode::Binary => a.sign(),
    };
    (shaped / adv_clip_max / 2.0 + 0.5).clamp(0.0, 1.0)
}

/// One NFT micro-batch at timestep `t` per row; the three velocities share `x_t` and its noise.
pub struct NftBatch<'a> {
    /// Clean final latents x0 (B, …).
    pub x0: &'a Tensor,
    /// `x_t = (1−t)·x0 + t·ε` (B, …).
    pub xt: &'a Tensor,
    /// `t = timestep/1000` per row (B,).
    pub t: &'a Tensor,
    /// Optimality probabilities r (B,).
    pub reward_prob: &'a Tensor,
    /// v_θ, the trained adapter's velocity (B, …), with gradient.
    pub policy_pred: &'a Tensor,
    /// v_old, the old adapter's velocity (B, …).
    pub old_pred: &'a Tensor,
    /// v_ref, the base model's velocity (B, …).
    pub ref_pred: &'a Tensor,
}

/// `policy = mean_b((r·L⁺ + (1−r)·L⁻)/β · M)`, `loss = policy + ref_kl_coef·mean((v_θ − v_ref)²)`.
/// Metrics `actor/policy_loss`, `actor/kl_loss`, `actor/loss_positive`, `actor/loss_negative`.
pub fn nft_loss(
    batch: &NftBatch<'_>,
    beta: f64,
    ref_kl_coef: f64,
    adv_clip_max: f64,
) -> Result<LossOutput, ObjectiveError> {
    same_shape(&[
        ("x0", batch.x0),
        ("xt", batch.xt),
        ("policy_pred", batch.policy_pred),
        ("old_pred", batch.old_pred),
        ("ref_pred", batch.ref_pred),
    ])?;
    let b = super::batch_rows(batch.x0, "x0")?;
    let mut shape = vec![b];
    shape.extend(std::iter::repeat_n(1, batch.x0.dim() - 1));
    let t = rows(batch.t, b, "t")?.reshape(shape.as_slice());
    let r = rows(batch.reward_prob, b, "reward_prob")?;
    let old = batch.old_pred.detach();
    let positive = batch.policy_pred * beta + &old * (1.0 - beta);
    let negative = &old * (1.0 + beta) - batch.policy_pred * beta;
    let weighted_error = |v: &Tensor| {
        let x0_hat = batch.xt - &t * v;
        let diff = x0_hat - batch.x0;
        let w = mean_elems(&diff.abs()).clamp_min(1e-5).detach().reshape(shape.as_slice());
        mean_elems(&(diff.square() / w))
    };
    let l_pos = weighted_error(&positive);
    let l_neg = weighted_error(&negative);
    let per_row: Tensor = (&r * &l_pos + (1.0 - &r) * &l_neg) / beta * adv_clip_max;
    let policy = per_row.mean(Kind::Float);
    let kl = (batch.policy_pred - batch.ref_pred.detach()).square().mean(Kind::Float);
    let loss = &policy + &kl * ref_kl_coef;
    let metrics = Metrics::from([
        ("actor/policy_loss".to_string(), scalar(&policy)?),
        ("actor/kl_loss".to_string(), scalar(&kl)?),
        ("actor/loss_positive".to_string(), scalar(&l_pos.mean(Kind::Float))?),
        ("actor/loss_negative".to_string(), scalar(&l_neg.mean(Kind::Float))?),
    ]);
    Ok(LossOutput { loss, metrics })
}

/// How the old adapter follows the trained one: `old ← d·old + (1−d)·θ` with
/// `d = 0` before `warmup`, else `min((step − warmup)·rate, max)` (d = 0 is a copy).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OldPolicyDecay {
    /// Always copy: (warmup 0, rate 0, max 0).
    Copy,
    /// (0, 0.001, 0.5): the DiffusionNFT default.
    #[default]
    #[serde(rename = "linear_to_0_5")]
    LinearTo0_5,
    /// (75, 0.0075, 0.999).
    #[serde(rename = "delayed_linear_to_0_999")]
    DelayedLinearTo0_999,
    /// (0, 0.001, 0.3): DGPO's reference EMA.
    #[serde(rename = "linear_to_0_3")]
    LinearTo0_3,
}

impl OldPolicyDecay {
    /// `(warmup, rate, max)`.
    pub fn parameters(self) -> (u64, f64, f64) {
        match self {
            Self::Copy => (0, 0.0, 0.0),
            Self::LinearTo0_5 => (0, 0.001, 0.5),
            Self::DelayedLinearTo0_999 => (75, 0.0075, 0.999),
            Self::LinearTo0_3 => (0, 0.001, 0.3),
        }
    }

    /// The decay `d` at training step `step`.
    pub fn decay(self, step: u64) -> f64 {
        let (warmup, rate, max) = self.parameters();
        if step < warmup {
            0.0
        } else {
            ((step - warmup) as f64 * rate).min(max)
        }
    }

    /// `old ← d·old + (1−d)·new` in place for each pair of tensors, without gradient.
    pub fn update(self, step: u64, old: &[Tensor], new: &[Tensor]) -> Result<(), ObjectiveError> {
        if old.len() != new.len() {
            return Err(ObjectiveError::Shape(format!(
                "old adapter has {} tensors, trained adapter {}",
                old.len(),
                new.len()
            )));
        }
        let d = self.decay(step);
        let _guard = tch::no_grad_guard();
        for (o, n) in old.iter().zip(new) {
            same_shape(&[("old adapter tensor", o), ("trained adapter tensor", n)])?;
            let mixed = o * d + n.detach() * (1.0 - d);
            o.shallow_clone().f_copy_(&mixed)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decay_schedules() {
        assert_eq!(OldPolicyDecay::Copy.decay(500), 0.0);
        assert_eq!(OldPolicyDecay::LinearTo0_5.decay(100), 0.1);
        assert_eq!(OldPolicyDecay::LinearTo0_5.decay(10_000), 0.5);
        assert_eq!(OldPolicyDecay::DelayedLinearTo0_999.decay(74), 0.0);
        assert!((OldPolicyDecay::DelayedLinearTo0_999.decay(175) - 0.75).abs() < 1e-12);
        assert_eq!(OldPolicyDecay::DelayedLinearTo0_999.decay(100_000), 0.999);
        let dgpo: Vec<f64> =
            [0, 100, 300, 1000].map(|k| OldPolicyDecay::LinearTo0_3.decay(k)).into();
        assert_eq!(dgpo, [0.0, 0.1, 0.3, 0.3]);
    }

    #[test]
    fn copy_refresh_equals_policy_and_ema_lags_it() {
        let theta = [Tensor::from_slice(&[1.0f32, 2.0]), Tensor::from_slice(&[3.0f32])];
        let old = [
            Tensor::zeros([2], (Kind::Float, tch::Device::Cpu)),
            Tensor::zeros([1], (Kind::Float, tch::Device::Cpu)),
        ];
        OldPolicyDecay::Copy.update(3, &old, &theta).unwrap();
        assert!(old[0].equal(&theta[0]) && old[1].equal(&theta[1]));
        let old = [
            Tensor::zeros([2], (Kind::Float, tch::Device::Cpu)),
            Tensor::zeros([1], (Kind::Float, tch::Device::Cpu)),
        ];
        OldPolicyDecay::LinearTo0_5.update(500, &old, &theta).unwrap();
        assert_eq!(Vec::<f32>::try_from(&old[0]).unwrap(), [0.5, 1.0]);
    }

    #[test]
    fn reward_modes() {
        let a = Tensor::from_slice(&[-7.0f32, -1.0, 0.0, 2.5]);
        let r = |m| Vec::<f32>::try_from(reward_probability(&a, m, 5.0)).unwrap();
        assert_eq!(r(RewardMode::Continuous), [0.0, 0.4, 0.5, 0.75]);
        assert_eq!(r(RewardMode::PositiveOnly), [0.5, 0.5, 0.5, 0.75]);
        assert_eq!(r(RewardMode::NegativeOnly), [0.0, 0.4, 0.5, 0.5]);
        assert_eq!(r(RewardMode::OneOnly), [0.5, 0.5, 0.5, 0.6]);
        assert_eq!(r(RewardMode::Binary), [0.4, 0.4, 0.5, 0.6]);
    }
}
