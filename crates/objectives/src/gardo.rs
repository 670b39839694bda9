//! GARDO's batch-level pieces (`docs/spec/algorithms.md` §5, "gardo"): diversity-shaped group
//! advantages, the uncertainty gate that picks which samples the KL regularises, and the
//! controller that adapts the gated share from step to step.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use serde::{Deserialize, Serialize};

use crate::ObjectiveError;

/// Diversity-shaped advantages of one step and the mean diversity they used.
#[derive(Debug, Clone, PartialEq)]
pub struct DiversityAdvantages {
    /// One advantage per sample: `(r − group mean) · w`.
    pub values: Vec<f64>,
    /// Each sample's distance to its nearest group neighbour, `min_j (1 − cos(f_i, f_j))`
    /// (0 for a sample alone in its group).
    pub distances: Vec<f64>,
}

/// `A_i = (r_i − mean_g r)·w_i` per prompt group `g`, without division by a standard deviation.
/// `w_i = 1` when `r_i` is below the group mean, else `d_i / mean_g d`, with `d_i` the cosine
/// distance from sample i's feature to the nearest other member's. A singleton group has
/// advantage 0; a group whose distances are all 0 keeps `w = 1`.
pub fn diversity_advantages<G: Eq + Hash>(
    rewards: &[f64],
    groups: &[G],
    features: &[Vec<f32>],
) -> Result<DiversityAdvantages, ObjectiveError> {
    let n = rewards.len();
    if groups.len() != n || features.len() != n {
        return Err(ObjectiveError::Shape(format!(
            "{n} rewards, {} group ids and {} feature rows",
            groups.len(),
            features.len()
        )));
    }
    if let Some(bad) = rewards.iter().position(|r| !r.is_finite()) {
        return Err(ObjectiveError::NonFinite(format!("reward of sample {bad}")));
    }
    let unit: Vec<Vec<f64>> = features.iter().map(|f| normalised(f)).collect();
    let mut members: HashMap<&G, Vec<usize>> = HashMap::new();
    for (i, g) in groups.iter().enumerate() {
        members.entry(g).or_default().push(i);
    }
    let (mut values, mut distances) = (vec![0.0; n], vec![0.0; n]);
    for rows in members.values().filter(|rows| rows.len() > 1) {
        let mean = rows.iter().map(|&i| rewards[i]).sum::<f64>() / rows.len() as f64;
        for &i in rows {
            distances[i] = rows
                .iter()
                .filter(|&&j| j != i)
                .map(|&j| 1.0 - dot(&unit[i], &unit[j]).clamp(-1.0, 1.0))
                .fold(f64::INFINITY, f64::min);
        }
        let mean_distance = rows.iter().map(|&i| distances[i]).sum::<f64>() / rows.len() as f64;
        for &i in rows {
            let centred = rewards[i] - mean;
            let weight = if centred < 0.0 || mean_distance == 0.0 {
                1.0
            } else {
                distances[i] / mean_distance
            };
            values[i] = centred * weight;
        }
    }
    Ok(DiversityAdvantages { values, distances })
}

fn normalised(f: &[f32]) -> Vec<f64> {
    let norm = f.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    f.iter().map(|&x| if norm > 0.0 { x as f64 / norm } else { 0.0 }).collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Descending ranks 1…B of `values` (1 = the highest; ties in order of position).
pub fn descending_ranks(values: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[b].total_cmp(&values[a]));
    let mut ranks = vec![0.0; values.len()];
    for (r, &i) in order.iter().enumerate() {
        ranks[i] = (r + 1) as f64;
    }
    ranks
}

/// Per-sample uncertainty: the rank of the trained reward minus the mean rank of the proxy
/// rewards, ranks taken over the whole step (`proxies` holds one score list per proxy reward).
pub fn uncertainty(trained: &[f64], proxies: &[Vec<f64>]) -> Vec<f64> {
    let main = descending_ranks(trained);
    if proxies.is_empty() {
        return vec![0.0; trained.len()];
    }
    let ranks: Vec<Vec<f64>> = proxies.iter().map(|p| descending_ranks(p)).collect();
    (0..trained.len())
        .map(|i| main[i] - ranks.iter().map(|r| r[i]).sum::<f64>() / ranks.len() as f64)
        .collect()
}

/// The `q`-th percentile (0…100) of `values` with linear interpolation between order statistics.
pub fn percentile(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let pos = (q / 100.0) * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// How the gated share `κ` follows the uncertainty: it grows by 10 % when the step's mean
/// non-negative uncertainty exceeds every one of the last 20 steps', shrinks by 10 % when it is
/// below all of them, and stays within [0.02, 0.2].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateController {
    /// The gated share κ.
    pub share: f64,
    /// The last steps' mean non-negative uncertainties, oldest first.
    pub history: VecDeque<f64>,
}

const SHARE_START: f64 = 0.1;
const SHARE_RANGE: (f64, f64) = (0.02, 0.2);
const SHARE_STEP: f64 = 0.1;
const HISTORY: usize = 20;

impl Default for GateController {
    fn default() -> Self {
        Self { share: SHARE_START, history: VecDeque::new() }
    }
}

impl GateController {
    /// Updates κ with this step's uncertainties and returns the gate: samples whose uncertainty
    /// is above the `100·(1 − κ)`-th percentile of the non-negative ones. No sample is gated (and
    /// κ stays) when no uncertainty is non-negative.
    pub fn gate(&mut self, uncertainty: &[f64]) -> Vec<bool> {
        let nonneg: Vec<f64> = uncertainty.iter().copied().filter(|&u| u >= 0.0).collect();
        if nonneg.is_empty() {
            return vec![false; uncertainty.len()];
        }
        let level = nonneg.iter().sum::<f64>() / nonneg.len() as f64;
        let max = self.history.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let min = self.history.iter().copied().fold(f64::INFINITY, f64::min);
        if self.history.is_empty() {
            self.share = SHARE_START;
        } else if level > max {
            self.share *= 1.0 + SHARE_STEP;
        } else if level < min {
            self.share *= 1.0 - SHARE_STEP;
        }
        self.share = self.share.clamp(SHARE_RANGE.0, SHARE_RANGE.1);
        self.history.push_back(level);
        if self.history.len() > HISTORY {
            self.history.pop_front();
        }
        let threshold = percentile(&nonneg, 100.0 - self.share * 100.0);
        uncertainty.iter().map(|&u| u > threshold).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_mean_samples_keep_weight_one_and_singletons_get_zero() {
        let features = vec![vec![1.0, 0.0], vec![0.0, 1.0], vec![1.0, 0.1], vec![3.0, 4.0]];
        let a = diversity_advantages(&[0.0, 1.0, 0.2, 5.0], &[0, 0, 0, 1], &features).unwrap();
        // Group mean 0.4: sample 0 (−0.4) and 2 (−0.2) keep w = 1.
        assert!((a.values[0] + 0.4).abs() < 1e-12 && (a.values[2] + 0.2).abs() < 1e-12);
        assert_eq!(a.values[3], 0.0);
        // Sample 1 ([0, 1]) is nearest to sample 2 ([1, 0.1]): d = 1 − 0.1/√1.01.
        let d1 = 1.0 - 0.1 / (1.01f64).sqrt();
        assert!((a.distances[1] - d1).abs() < 1e-6);
        let mean_d = (a.distances[0] + a.distances[1] + a.distances[2]) / 3.0;
        assert!((a.values[1] - 0.6 * d1 / mean_d).abs() < 1e-6);
    }

    #[test]
    fn ranks_and_percentile_follow_numpy() {
        assert_eq!(descending_ranks(&[0.3, 0.9, 0.1]), [2.0, 1.0, 3.0]);
        // numpy.percentile([1, 2, 4, 8], 90) = 6.8 (linear).
        assert!((percentile(&[8.0, 1.0, 4.0, 2.0], 90.0) - 6.8).abs() < 1e-12);
    }

    #[test]
    fn the_share_grows_with_rising_uncertainty_and_stays_in_range() {
        let mut c = GateController::default();
        let gate = c.gate(&[3.0, -1.0, 0.0, 1.0]);
        assert_eq!(c.share, 0.1);
        // Non-negative {3, 0, 1}: the 90th percentile is 2.6, only the 3 is above it.
        assert_eq!(gate, [true, false, false, false]);
        c.gate(&[5.0, 4.0]);
        assert!((c.share - 0.11).abs() < 1e-12);
        // A falling level shrinks κ at every step, down to its floor.
        for i in 0..40 {
            c.gate(&[1.0 / (i as f64 + 10.0)]);
        }
        assert_eq!(c.share, 0.02);
        assert_eq!(c.history.len(), 20);
        assert_eq!(c.gate(&[-1.0, -2.0]), [false, false]);
    }
}
