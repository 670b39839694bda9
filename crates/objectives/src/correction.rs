//! Rollout correction: when the trainer recomputes the old log-probs, the rollout's own log-probs
//! may differ (another precision, another kernel). Importance weights `π_old/π_rollout` correct the
//! gradient, and rejection drops the (sample, step) entries whose ratio is an outlier — the
//! reference framework's `rollout_is` / `rollout_rs`, with a trained denoising step in the role of a
//! token and a sample's W window steps in the role of a sequence.

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::losses::Metrics;
use crate::ObjectiveError;

/// At what level a ratio is formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Each (sample, trained step) on its own.
    Token,
    /// The product of a sample's step ratios, shared by its steps.
    Sequence,
    /// The geometric mean of a sample's step ratios (rejection only).
    Geometric,
}

/// The recipe's `rollout_correction` section. Everything off by default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CorrectionConfig {
    /// Importance weights at this level (token or sequence), truncated at `rollout_is_threshold`.
    pub rollout_is: Option<Level>,
    /// Importance weights above this are truncated to it (> 1); also rejection's default upper
    /// bound.
    pub rollout_is_threshold: f64,
    /// Reject entries whose ratio at this level leaves `[lower, upper]`.
    pub rollout_rs: Option<Level>,
    /// Upper bound of rejection; defaults to `rollout_is_threshold`.
    pub rollout_rs_threshold: Option<f64>,
    /// Lower bound of rejection; defaults to 1 / upper.
    pub rollout_rs_threshold_lower: Option<f64>,
}

impl Default for CorrectionConfig {
    fn default() -> Self {
        Self {
            rollout_is: None,
            rollout_is_threshold: 2.0,
            rollout_rs: None,
            rollout_rs_threshold: None,
            rollout_rs_threshold_lower: None,
        }
    }
}

/// What the loss applies: weights and a keep mask, both (B, W).
#[derive(Debug)]
pub struct Correction {
    /// Importance weights (1 where IS is off).
    pub weights: Tensor,
    /// Entries that stay in the loss (and its denominator).
    pub keep: Tensor,
    /// `rollout_corr/*` metrics.
    pub metrics: Metrics,
}

/// Ratios are bounded to `[e^−20, e^20]` before anything else, as the reference does.
const SAFETY: f64 = 20.0;

impl CorrectionConfig {
    /// Whether any correction is applied.
    pub fn enabled(&self) -> bool {
        self.rollout_is.is_some() || self.rollout_rs.is_some()
    }

    /// Checks the settings; the error names the key and what is allowed.
    pub fn validate(&self) -> Result<(), ObjectiveError> {
        if self.rollout_is == Some(Level::Geometric) {
            return Err(ObjectiveError::invalid(
                "rollout_is",
                "geometric",
                "token or sequence (geometric is for rollout_rs)",
            ));
        }
        if !(self.rollout_is_threshold > 1.0 && self.rollout_is_threshold.is_finite()) {
            return Err(ObjectiveError::invalid(
                "rollout_is_threshold",
                self.rollout_is_threshold,
                "a finite number > 1",
            ));
        }
        let (lower, upper) = self.rejection_bounds();
        if !(upper > 1.0 && upper.is_finite() && lower > 0.0 && lower < 1.0) {
            return Err(ObjectiveError::invalid(
                "rollout_rs_threshold",
                format!("[{lower}, {upper}]"),
                "lower in (0, 1) and upper > 1",
            ));
        }
        Ok(())
    }

    fn rejection_bounds(&self) -> (f64, f64) {
        let upper = self.rollout_rs_threshold.unwrap_or(self.rollout_is_threshold);
        (self.rollout_rs_threshold_lower.unwrap_or(1.0 / upper), upper)
    }

    /// Weights and mask from the old-policy and rollout log-probs, both (B, W).
    pub fn compute(
        &self,
        old_log_prob: &Tensor,
        rollout_log_prob: &Tensor,
    ) -> Result<Correction, ObjectiveError> {
        if old_log_prob.size() != rollout_log_prob.size() || old_log_prob.dim() != 2 {
            return Err(ObjectiveError::Shape(format!(
                "old log-probs {:?} and rollout log-probs {:?} must both be (B, W)",
                old_log_prob.size(),
                rollout_log_prob.size()
            )));
        }
        let log_ratio = (old_log_prob - rollout_log_prob).to_kind(Kind::Float).detach();
        let at = |level: Level| {
            let w = log_ratio.size()[1];
            match level {
                Level::Token => log_ratio.shallow_clone(),
                Level::Sequence => log_ratio.sum_dim_intlist(1, true, Kind::Float).repeat([1, w]),
                Level::Geometric => log_ratio.mean_dim(1, true, Kind::Float).repeat([1, w]),
            }
            .clamp(-SAFETY, SAFETY)
            .exp()
        };
        let mut metrics = Metrics::new();
        let scalar = |t: &Tensor| t.double_value(&[]);
        let weights = match self.rollout_is {
            Some(level) => {
                let raw = at(level);
                let t = self.rollout_is_threshold;
                let high = raw.gt(t).to_kind(Kind::Float).mean(Kind::Float);
                metrics.insert("rollout_corr/rollout_is_ratio_fraction_high".into(), scalar(&high));
                let w = raw.clamp_max(t);
                metrics.insert("rollout_corr/rollout_is_mean".into(), scalar(&w.mean(Kind::Float)));
                metrics.insert("rollout_corr/rollout_is_std".into(), scalar(&w.std(true)));
                metrics.insert("rollout_corr/rollout_is_min".into(), scalar(&w.min()));
                metrics.insert("rollout_corr/rollout_is_max".into(), scalar(&w.max()));
                // Normalised effective sample size, 1 when every weight is equal.
                let ess = w.mean(Kind::Float).square() / w.square().mean(Kind::Float);
                metrics.insert("rollout_corr/rollout_is_eff_sample_size".into(), scalar(&ess));
                w
            }
            None => log_ratio.ones_like(),
        };
        let keep = match self.rollout_rs {
            Some(level) => {
                let raw = at(level);
                let (lower, upper) = self.rejection_bounds();
                let keep = raw.ge(lower).logical_and(&raw.le(upper));
                let dropped = keep.logical_not().to_kind(Kind::Float).mean(Kind::Float);
                metrics.insert("rollout_corr/rollout_rs_masked_fraction".into(), scalar(&dropped));
                keep
            }
            None => log_ratio.ones_like().to_kind(Kind::Bool),
        };
        // How far the rollout policy is from the trainer's, whatever the correction.
        let ratio = log_ratio.exp();
        metrics.insert("rollout_corr/kl".into(), scalar(&(-&log_ratio).mean(Kind::Float)));
        metrics.insert(
            "rollout_corr/k3_kl".into(),
            scalar(&(&ratio - &log_ratio - 1.0).mean(Kind::Float)),
        );
        metrics.insert(
            "rollout_corr/chi2_token".into(),
            scalar(&(ratio.square().mean(Kind::Float) - 1.0)),
        );
        Ok(Correction { weights, keep, metrics })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(rows: &[[f32; 2]]) -> Tensor {
        Tensor::from_slice(&rows.concat()).reshape([rows.len() as i64, 2])
    }

    #[test]
    fn equal_log_probs_give_unit_weights_and_keep_everything() {
        let lp = t(&[[0.3, -1.0], [2.0, 0.5]]);
        let c = CorrectionConfig {
            rollout_is: Some(Level::Sequence),
            rollout_rs: Some(Level::Token),
            ..Default::default()
        }
        .compute(&lp, &lp)
        .unwrap();
        assert_eq!(Vec::<f32>::try_from(c.weights.flatten(0, -1)).unwrap(), [1.0; 4]);
        assert_eq!(c.metrics["rollout_corr/rollout_rs_masked_fraction"], 0.0);
        assert_eq!(c.metrics["rollout_corr/kl"], 0.0);
    }

    #[test]
    fn token_and_sequence_weights_truncate_and_reject() {
        let rollout = t(&[[0.0, 0.0], [0.0, 0.0]]);
        // Ratios e^0.5 ≈ 1.65 and e^1 ≈ 2.72 in row 0; e^−0.1 and 1 in row 1.
        let old = t(&[[0.5, 1.0], [-0.1, 0.0]]);
        let token = CorrectionConfig { rollout_is: Some(Level::Token), ..Default::default() }
            .compute(&old, &rollout)
            .unwrap();
        let w = Vec::<f32>::try_from(token.weights.flatten(0, -1)).unwrap();
        assert!((w[0] - 0.5f32.exp()).abs() < 1e-6 && w[1] == 2.0, "{w:?}");
        assert!((w[2] - (-0.1f32).exp()).abs() < 1e-6 && w[3] == 1.0);
        assert_eq!(token.metrics["rollout_corr/rollout_is_ratio_fraction_high"], 0.25);
        let seq = CorrectionConfig {
            rollout_is: Some(Level::Sequence),
            rollout_is_threshold: 10.0,
            rollout_rs: Some(Level::Geometric),
            rollout_rs_threshold: Some(1.5),
            ..Default::default()
        }
        .compute(&old, &rollout)
        .unwrap();
        let w = Vec::<f32>::try_from(seq.weights.flatten(0, -1)).unwrap();
        assert!((w[0] - 1.5f32.exp()).abs() < 1e-5 && w[0] == w[1], "{w:?}");
        // Row 0's geometric ratio e^0.75 ≈ 2.1 is above 1.5: both its steps are rejected.
        let keep = Vec::<bool>::try_from(seq.keep.flatten(0, -1)).unwrap();
        assert_eq!(keep, [false, false, true, true]);
    }

    #[test]
    fn bad_settings_are_named() {
        let geometric_is =
            CorrectionConfig { rollout_is: Some(Level::Geometric), ..Default::default() };
        assert!(geometric_is.validate().unwrap_err().to_string().contains("rollout_is"));
        let low = CorrectionConfig { rollout_rs_threshold: Some(0.9), ..Default::default() };
        assert!(low.validate().unwrap_err().to_string().contains("rollout_rs_threshold"));
    }
}
