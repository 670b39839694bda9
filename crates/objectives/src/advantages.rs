//! Group-relative advantages of the GRPO family (`docs/spec/algorithms.md` §4).

use std::collections::HashMap;
use std::hash::Hash;

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::ObjectiveError;

/// The recipe's `advantage` section: how rewards become group-relative advantages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AdvantageConfig {
    /// One standard deviation over the whole batch (true) or one per prompt group.
    pub global_std: bool,
    /// Divide by the standard deviation (false: Dr.GRPO, mean-centred only).
    pub norm_adv_by_std: bool,
}

impl Default for AdvantageConfig {
    fn default() -> Self {
        Self { global_std: true, norm_adv_by_std: true }
    }
}

/// Advantages of a batch and the statistics reported with them.
#[derive(Debug)]
pub struct Advantages {
    /// (B, W) f32: one row per sample, repeated over its W trained steps.
    pub values: Tensor,
    /// Fraction of groups whose rewards are all equal (`critic/rewards/zero_std_ratio`); a
    /// singleton group counts as equal.
    pub zero_std_ratio: f64,
}

const STD_EPS: f64 = 1e-4;

/// Advantages of rewards `r[b]` broadcast over `steps` trained steps, grouped by `groups[b]` (the
/// prompt uid). Means are per group (a singleton's mean is itself, so its advantage is 0);
/// standard deviations are unbiased, over the B·W broadcast values.
pub fn group_advantages<G: Eq + Hash>(
    rewards: &[f32],
    groups: &[G],
    steps: usize,
    config: &AdvantageConfig,
) -> Result<Advantages, ObjectiveError> {
    if rewards.len() != groups.len() {
        return Err(ObjectiveError::Shape(format!(
            "{} rewards but {} group ids",
            rewards.len(),
            groups.len()
        )));
    }
    if steps == 0 || rewards.is_empty() {
        return Err(ObjectiveError::Shape("advantages need ≥ 1 sample and ≥ 1 step".into()));
    }
    if let Some(bad) = rewards.iter().position(|r| !r.is_finite()) {
        return Err(ObjectiveError::NonFinite(format!(
            "reward of sample {bad} is {}",
            rewards[bad]
        )));
    }
    let mut members: HashMap<&G, Vec<usize>> = HashMap::new();
    for (i, g) in groups.iter().enumerate() {
        members.entry(g).or_default().push(i);
    }
    let w = steps as f64;
    let values: Vec<f64> = rewards.iter().map(|&r| r as f64).collect();
    let global = unbiased_std(&values, w);
    let mut adv = vec![0f64; values.len()];
    let mut equal_groups = 0usize;
    for rows in members.values() {
        let group: Vec<f64> = rows.iter().map(|&i| values[i]).collect();
        if group.iter().all(|&r| r == group[0]) {
            equal_groups += 1;
        }
        if rows.len() == 1 {
            continue;
        }
        let mean = group.iter().sum::<f64>() / group.len() as f64;
        let std = if config.global_std { global } else { unbiased_std(&group, w) };
        for &i in rows {
            let centred = values[i] - mean;
            adv[i] = if config.norm_adv_by_std { centred / (std + STD_EPS) } else { centred };
        }
    }
    let flat: Vec<f32> = adv.iter().flat_map(|&a| std::iter::repeat_n(a as f32, steps)).collect();
    let values = Tensor::from_slice(&flat).reshape([rewards.len() as i64, steps as i64]);
    Ok(Advantages { values, zero_std_ratio: equal_groups as f64 / members.len() as f64 })
}

/// Unbiased standard deviation of `values`, each repeated `w` times; 1.0 for a single value.
fn unbiased_std(values: &[f64], w: f64) -> f64 {
    let n = values.len() as f64 * w;
    if n < 2.0 {
        return 1.0;
    }
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let ss: f64 = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() * w;
    (ss / (n - 1.0)).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(t: &Tensor) -> Vec<Vec<f32>> {
        Vec::<Vec<f32>>::try_from(t).unwrap()
    }

    #[test]
    fn singleton_groups_get_zero() {
        for (global_std, norm) in [(true, true), (false, true), (true, false), (false, false)] {
            let cfg = AdvantageConfig { global_std, norm_adv_by_std: norm };
            let a = group_advantages(&[0.3, 0.9, 0.1, 0.7], &[0, 1, 2, 2], 2, &cfg).unwrap();
            let v = rows(&a.values);
            assert_eq!(v[0], [0.0, 0.0]);
            assert_eq!(v[1], [0.0, 0.0]);
            assert!(v[2][0] < 0.0 && v[3][0] > 0.0);
        }
    }

    #[test]
    fn zero_std_ratio_counts_flat_groups() {
        let cfg = AdvantageConfig::default();
        let a = group_advantages(&[1.0, 1.0, 0.0, 2.0], &["a", "a", "b", "b"], 1, &cfg).unwrap();
        assert_eq!(a.zero_std_ratio, 0.5);
        assert_eq!(rows(&a.values)[0], [0.0]);
    }

    #[test]
    fn non_finite_reward_is_an_error() {
        let cfg = AdvantageConfig::default();
        let err = group_advantages(&[1.0, f32::NAN], &[0, 0], 1, &cfg).unwrap_err();
        assert!(err.to_string().contains("sample 1"), "{err}");
    }
}
