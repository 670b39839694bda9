//! GARDO's step loss (`docs/spec/algorithms.md` §5, "gardo"): Flow-GRPO's clipped ratio with
//! each row weighted by its share of the batch's noise scale, plus the KL to the anchor policy on
//! the gated rows only.

use tch::{Kind, Tensor};

use super::policy::{clipped, ratio_metrics};
use super::{mean_elems, rows, same_shape, scalar, LossConfig, LossOutput, Metrics};
use crate::ObjectiveError;

/// One micro-batch of B rows at one trained step.
pub struct GardoBatch<'a> {
    /// log p_θ of the stored transition (B,), with gradient.
    pub log_prob: &'a Tensor,
    /// log p_old (B,).
    pub old_log_prob: &'a Tensor,
    /// Diversity-shaped advantages (B,).
    pub advantages: &'a Tensor,
    /// The step's noise scale `s` per row (without √−dt).
    pub std_dev_t: &'a Tensor,
    /// μ_θ (B, …), with gradient.
    pub prev_sample_mean: &'a Tensor,
    /// μ of the anchor (reference) policy on the same step (B, …).
    pub anchor_prev_sample_mean: &'a Tensor,
    /// Rows the KL applies to (B,, bool).
    pub gate: &'a Tensor,
}

/// `L = mean_b((s_b / mean s)·max(−A·ρ, −A·clamp(ρ, 1±ε))) + kl_loss_coef·KL`, where KL is
/// `mean over gated b of mean_elems((μ_θ − μ_anchor)²) / (2 s_b²)` (0 with no gated row).
/// Metrics: the ratio metrics, `actor/ppo_kl`, `actor/pg_loss`, `actor/kl_loss`.
pub fn gardo_loss(
    batch: &GardoBatch<'_>,
    config: &LossConfig,
) -> Result<LossOutput, ObjectiveError> {
    same_shape(&[
        ("log_prob", batch.log_prob),
        ("old_log_prob", batch.old_log_prob),
        ("advantages", batch.advantages),
    ])?;
    same_shape(&[
        ("prev_sample_mean", batch.prev_sample_mean),
        ("anchor_prev_sample_mean", batch.anchor_prev_sample_mean),
    ])?;
    let b = super::batch_rows(batch.prev_sample_mean, "prev_sample_mean")?;
    if batch.log_prob.size() != [b] {
        return Err(ObjectiveError::Shape(format!(
            "log_prob must be ({b},), got {:?}",
            batch.log_prob.size()
        )));
    }
    let s = rows(batch.std_dev_t, b, "std_dev_t")?;
    let gate = rows(batch.gate, b, "gate")?.to_kind(Kind::Bool).detach();
    let log_ratio = batch.log_prob - batch.old_log_prob;
    let ratio = log_ratio.exp();
    let weight = (&s / s.mean(Kind::Float)).detach();
    let policy = (weight * clipped(&ratio, batch.advantages, config)).mean(Kind::Float);
    let per_row: Tensor =
        mean_elems(&(batch.prev_sample_mean - batch.anchor_prev_sample_mean).square())
            / (2.0 * s.square());
    let kind = per_row.kind();
    let gated = gate.to_kind(kind);
    let kl = (per_row * &gated).sum(kind) / gated.sum(kind).clamp_min(1.0);
    let loss = &policy + &kl * config.kl_loss_coef;
    let mut metrics = Metrics::new();
    ratio_metrics(&mut metrics, &ratio, config.clip_ratio)?;
    metrics.insert("actor/ppo_kl".into(), scalar(&(-&log_ratio).mean(Kind::Float))?);
    metrics.insert("actor/pg_loss".into(), scalar(&policy)?);
    metrics.insert("actor/kl_loss".into(), scalar(&kl)?);
    Ok(LossOutput { loss, metrics })
}
