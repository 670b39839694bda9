//! Policy-gradient losses on one trained denoising step (`docs/spec/algorithms.md` §5):
//! Flow-GRPO's clipped ratio, GRPO-Guard's re-centred ratio, Flow-DPPO's divergence mask, and the
//! KL to the reference policy.

use tch::{Kind, Tensor};

use super::{fraction, mean_elems, rows, same_shape, scalar, LossConfig, LossOutput, Metrics};
use crate::ObjectiveError;

/// Which policy-gradient loss an algorithm uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyLoss {
    /// Flow-GRPO / DanceGRPO / MixGRPO: PPO-clipped ratio of step log-probs.
    Clipped,
    /// GRPO-Guard: ratio re-centred by the mean shift, then clipped, rescaled by `mean(√−dt)²`.
    Guard,
    /// Flow-DPPO: unclipped ratio, samples whose divergence crossed the threshold are dropped.
    Dppo,
}

/// Inputs of a policy-gradient loss for a micro-batch of B rows at one trained step.
pub struct PolicyBatch<'a> {
    /// log p_θ of the stored transition (B,), with gradient.
    pub log_prob: &'a Tensor,
    /// log p_old of the same transition (B,).
    pub old_log_prob: &'a Tensor,
    /// Advantages (B,).
    pub advantages: &'a Tensor,
    /// μ_θ (B, …), with gradient; needed by `Guard` and `Dppo`.
    pub prev_sample_mean: Option<&'a Tensor>,
    /// μ_old (B, …); needed by `Guard` and `Dppo`.
    pub old_prev_sample_mean: Option<&'a Tensor>,
    /// The step's noise scale `s` per row; needed by `Guard` and `Dppo`.
    pub std_dev_t: Option<&'a Tensor>,
    /// `√−dt` per row; needed by `Guard` and `Dppo`.
    pub sqrt_dt: Option<&'a Tensor>,
    /// Rollout-correction importance weights per row (B,); none means 1.
    pub weights: Option<&'a Tensor>,
    /// Rows kept by rollout rejection (B,, bool); dropped rows leave the loss and its denominator.
    pub keep: Option<&'a Tensor>,
}

impl PolicyLoss {
    /// Every name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Clipped => "flow_grpo",
            Self::Guard => "grpo_guard",
            Self::Dppo => "flow_dppo",
        }
    }

    /// Whether the loss needs the transition means of the current and old policy.
    pub fn needs_means(self) -> bool {
        !matches!(self, Self::Clipped)
    }

    /// The loss of one step and its metrics (`actor/pg_clipfrac`, `actor/ppo_kl`, …).
    pub fn compute(
        self,
        batch: &PolicyBatch<'_>,
        config: &LossConfig,
    ) -> Result<LossOutput, ObjectiveError> {
        if batch.log_prob.dim() != 1 {
            return Err(ObjectiveError::Shape(format!(
                "log_prob must be (B,), got {:?}",
                batch.log_prob.size()
            )));
        }
        let b = batch.log_prob.size()[0];
        same_shape(&[
            ("log_prob", batch.log_prob),
            ("old_log_prob", batch.old_log_prob),
            ("advantages", batch.advantages),
        ])?;
        let log_ratio = batch.log_prob - batch.old_log_prob;
        let mut metrics = Metrics::new();
        let out = match self {
            Self::Clipped => {
                let ratio = log_ratio.exp();
                let loss = batch.aggregate(&clipped(&ratio, batch.advantages, config));
                ratio_metrics(&mut metrics, &ratio, config.clip_ratio)?;
                loss
            }
            Self::Guard => {
                let m = self.means(batch, b)?;
                let c = m.sqrt_dt.mean(Kind::Float) * m.std.mean(Kind::Float);
                let bias = mean_elems(&(m.mean - m.old_mean).square()) / (2.0 * c.square());
                let shifted: Tensor = &log_ratio + bias;
                let ratio = (shifted * &c).exp();
                let loss = batch.aggregate(&clipped(&ratio, batch.advantages, config));
                ratio_metrics(&mut metrics, &ratio, config.clip_ratio)?;
                loss / m.sqrt_dt.mean(Kind::Float).square()
            }
            Self::Dppo => {
                let m = self.means(batch, b)?;
                let ratio = log_ratio.exp();
                let shape = broadcast_rows(m.mean);
                let sq = (m.mean - m.old_mean).square();
                let divergence = if config.add_kl_coefficient {
                    let var = (&m.std * &m.sqrt_dt).square().reshape(shape.as_slice());
                    mean_elems(&(sq / (2.0 * var)))
                } else {
                    mean_elems(&sq) / 2.0
                };
                let a = batch.advantages;
                let favoured = ratio
                    .gt(1.0)
                    .logical_and(&a.gt(0.0))
                    .logical_or(&ratio.lt(1.0).logical_and(&a.lt(0.0)));
                let drop = divergence.ge(config.kl_mask_threshold).logical_and(&favoured).detach();
                let objective = -(a * &ratio);
                let loss = batch.aggregate(&objective.where_scalarother(&drop.logical_not(), 0.0));
                ratio_metrics(&mut metrics, &ratio, config.clip_ratio)?;
                metrics.insert("actor/masked_fraction".into(), fraction(&drop)?);
                loss
            }
        };
        metrics.insert("actor/ppo_kl".into(), scalar(&(-&log_ratio).mean(Kind::Float))?);
        metrics.insert("actor/pg_loss".into(), scalar(&out)?);
        Ok(LossOutput { loss: out, metrics })
    }

    fn means<'a>(self, batch: &PolicyBatch<'a>, b: i64) -> Result<Means<'a>, ObjectiveError> {
        let need = |t: Option<&'a Tensor>, name: &str| {
            t.ok_or_else(|| {
                ObjectiveError::Missing(format!(
                    "{} needs `{name}` from the old-policy pass (recompute old log-probs, or record transition means in the rollout)",
                    self.name()
                ))
            })
        };
        let mean = need(batch.prev_sample_mean, "prev_sample_mean")?;
        let old_mean = need(batch.old_prev_sample_mean, "old_prev_sample_mean")?;
        same_shape(&[("prev_sample_mean", mean), ("old_prev_sample_mean", old_mean)])?;
        if mean.dim() < 2 || mean.size()[0] != b {
            return Err(ObjectiveError::Shape(format!(
                "prev_sample_mean has shape {:?} for a batch of {b}",
                mean.size()
            )));
        }
        let std = rows(need(batch.std_dev_t, "std_dev_t")?, b, "std_dev_t")?;
        let sqrt_dt = rows(need(batch.sqrt_dt, "sqrt_dt")?, b, "sqrt_dt")?;
        Ok(Means { mean, old_mean, std, sqrt_dt })
    }
}

struct Means<'a> {
    mean: &'a Tensor,
    old_mean: &'a Tensor,
    std: Tensor,
    sqrt_dt: Tensor,
}

/// Shape that broadcasts a per-row (B,) value against `like` (B, …).
fn broadcast_rows(like: &Tensor) -> Vec<i64> {
    let mut shape = vec![-1i64];
    shape.extend(std::iter::repeat_n(1, like.dim().saturating_sub(1)));
    shape
}

/// Per row `max(−A·ρ, −A·clamp(ρ, 1−ε, 1+ε))` with `A` clamped to ±`adv_clip_max`.
pub(super) fn clipped(ratio: &Tensor, advantages: &Tensor, config: &LossConfig) -> Tensor {
    let a = advantages.clamp(-config.adv_clip_max, config.adv_clip_max);
    let eps = config.clip_ratio;
    let unclipped = -(&a * ratio);
    let clipped = -(&a * ratio.clamp(1.0 - eps, 1.0 + eps));
    unclipped.maximum(&clipped)
}

impl PolicyBatch<'_> {
    /// The mean of per-row losses (B,) under the rollout correction: each row times its weight,
    /// averaged over the kept rows.
    fn aggregate(&self, per_row: &Tensor) -> Tensor {
        let weighted = match self.weights {
            Some(w) => per_row * w.detach(),
            None => per_row.shallow_clone(),
        };
        match self.keep {
            Some(keep) => {
                let kept = keep.to_kind(Kind::Float);
                (weighted * &kept).sum(Kind::Float) / kept.sum(Kind::Float).clamp_min(1.0)
            }
            None => weighted.mean(Kind::Float),
        }
    }
}

pub(super) fn ratio_metrics(
    metrics: &mut Metrics,
    ratio: &Tensor,
    eps: f64,
) -> Result<(), ObjectiveError> {
    let r = ratio.detach();
    metrics.insert("actor/pg_clipfrac".into(), fraction(&(&r - 1.0).abs().gt(eps))?);
    metrics.insert("actor/pg_clipfrac_higher".into(), fraction(&r.gt(1.0 + eps))?);
    metrics.insert("actor/pg_clipfrac_lower".into(), fraction(&r.lt(1.0 - eps))?);
    metrics.insert("actor/ratio_mean".into(), scalar(&r.mean(Kind::Float))?);
    let std = if r.numel() > 1 { scalar(&r.std(true))? } else { 0.0 };
    metrics.insert("actor/ratio_std".into(), std);
    Ok(())
}

/// KL of the policy step to the reference step: `mean_b(mean_elems((μ_θ − μ_ref)²) / (2·s²))`,
/// with `s` the step's noise scale without `√−dt`. Metric `actor/kl_loss`.
pub fn kl_to_reference(
    prev_sample_mean: &Tensor,
    ref_prev_sample_mean: &Tensor,
    std_dev_t: &Tensor,
) -> Result<LossOutput, ObjectiveError> {
    same_shape(&[
        ("prev_sample_mean", prev_sample_mean),
        ("ref_prev_sample_mean", ref_prev_sample_mean),
    ])?;
    let b = super::batch_rows(prev_sample_mean, "prev_sample_mean")?;
    let s = rows(std_dev_t, b, "std_dev_t")?;
    let per_row: Tensor =
        mean_elems(&(prev_sample_mean - ref_prev_sample_mean).square()) / (2.0 * s.square());
    let loss = per_row.mean(Kind::Float);
    let metrics = Metrics::from([("actor/kl_loss".to_string(), scalar(&loss)?)]);
    Ok(LossOutput { loss, metrics })
}

/// On-policy distillation (DiffusionOPD's `distill_kl`): the KL of the policy step to a teacher's
/// step on the same recorded state, `mean_b(w_b·mean_elems((μ_θ − μ_T)²) / (2·s_b²))` with `w` the
/// routed teacher's weight (1 when none). Metric `actor/distill_kl_loss`.
pub fn distill_kl(
    prev_sample_mean: &Tensor,
    teacher_prev_sample_mean: &Tensor,
    std_dev_t: &Tensor,
    weights: Option<&Tensor>,
) -> Result<LossOutput, ObjectiveError> {
    let kl = kl_to_reference(prev_sample_mean, teacher_prev_sample_mean, std_dev_t)?;
    let loss = match weights {
        None => kl.loss,
        Some(w) => {
            let b = super::batch_rows(prev_sample_mean, "prev_sample_mean")?;
            let s = rows(std_dev_t, b, "std_dev_t")?;
            let per_row: Tensor =
                mean_elems(&(prev_sample_mean - teacher_prev_sample_mean).square())
                    / (2.0 * s.square());
            (per_row * rows(w, b, "weights")?.detach()).mean(Kind::Float)
        }
    };
    let metrics = Metrics::from([("actor/distill_kl_loss".to_string(), scalar(&loss)?)]);
    Ok(LossOutput { loss, metrics })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_policy_ratio_is_one_and_clipping_is_inactive() {
        let logp = Tensor::from_slice(&[-1.3f32, 0.2, 2.0, -0.7]).set_requires_grad(true);
        let old = logp.detach();
        let adv = Tensor::from_slice(&[7.0f32, -0.4, 0.3, -9.0]);
        let batch = without_means(&logp, &old, &adv);
        let config = LossConfig { clip_ratio: 1e-5, ..Default::default() };
        let out = PolicyLoss::Clipped.compute(&batch, &config).unwrap();
        assert_eq!(out.metrics["actor/ratio_mean"], 1.0);
        assert_eq!(out.metrics["actor/ratio_std"], 0.0);
        assert_eq!(out.metrics["actor/pg_clipfrac"], 0.0);
        assert_eq!(out.metrics["actor/ppo_kl"], 0.0);
        out.loss.backward();
        // ∂L/∂logp = −clamp(A)/B exactly: no gradient is lost to clipping.
        let grad: Vec<f32> = Vec::try_from(&logp.grad()).unwrap();
        assert_eq!(grad, [-5.0 / 4.0, 0.4 / 4.0, -0.3 / 4.0, 5.0 / 4.0]);
    }

    /// A batch with only log-probs and advantages.
    fn without_means<'a>(
        log_prob: &'a Tensor,
        old_log_prob: &'a Tensor,
        advantages: &'a Tensor,
    ) -> PolicyBatch<'a> {
        PolicyBatch {
            log_prob,
            old_log_prob,
            advantages,
            prev_sample_mean: None,
            old_prev_sample_mean: None,
            std_dev_t: None,
            sqrt_dt: None,
            weights: None,
            keep: None,
        }
    }

    #[test]
    fn correction_weights_rows_and_drops_rejected_ones_from_the_mean() {
        let logp = Tensor::zeros([3], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let old = Tensor::zeros([3], (Kind::Float, tch::Device::Cpu));
        let adv = Tensor::from_slice(&[1.0f32, -2.0, 3.0]);
        let (weights, keep) =
            (Tensor::from_slice(&[0.5f32, 2.0, 1.0]), Tensor::from_slice(&[true, true, false]));
        let batch = PolicyBatch {
            weights: Some(&weights),
            keep: Some(&keep),
            ..without_means(&logp, &old, &adv)
        };
        let out = PolicyLoss::Clipped.compute(&batch, &LossConfig::default()).unwrap();
        // Rows 0 and 1 only, over 2: (−1·0.5 + 2·2) / 2.
        assert!((out.loss.double_value(&[]) - 1.75).abs() < 1e-6);
        out.loss.backward();
        assert_eq!(Vec::<f32>::try_from(&logp.grad()).unwrap(), [-0.25, 2.0, 0.0]);
    }

    #[test]
    fn non_vector_log_probs_are_rejected() {
        let t = Tensor::zeros([2, 1], (Kind::Float, tch::Device::Cpu));
        let batch = without_means(&t, &t, &t);
        let err =
            PolicyLoss::Clipped.compute(&batch, &LossConfig::default()).unwrap_err().to_string();
        assert!(err.contains("log_prob must be (B,), got [2, 1]"), "{err}");
    }

    #[test]
    fn guard_without_means_says_what_is_missing() {
        let t = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu));
        let batch = without_means(&t, &t, &t);
        let err =
            PolicyLoss::Guard.compute(&batch, &LossConfig::default()).unwrap_err().to_string();
        assert!(err.contains("grpo_guard needs `prev_sample_mean`"), "{err}");
    }
}
