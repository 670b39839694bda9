//! Losses of every algorithm, each returning the loss tensor (differentiable w.r.t. the policy's
//! outputs) and the metrics the reference framework logs under the same names.

mod dgpo;
mod dmd2;
mod dpo;
mod gardo;
mod nft;
mod policy;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::ObjectiveError;

pub use dgpo::{dgpo_loss, DgpoBatch, DgpoSettings};
pub use dmd2::{dmd_gradient, dmd_loss, fake_score_loss, teacher_guidance, CfgNorm, Dmd2Config};
pub use dpo::{dpo_loss, DpoBatch};
pub use gardo::{gardo_loss, GardoBatch};
pub use nft::{nft_loss, reward_probability, NftBatch, OldPolicyDecay, RewardMode};
pub use policy::{distill_kl, kl_to_reference, PolicyBatch, PolicyLoss};

/// Named scalar metrics of one loss evaluation (`actor/pg_clipfrac`, …).
pub type Metrics = BTreeMap<String, f64>;

/// A loss and its metrics.
#[derive(Debug)]
pub struct LossOutput {
    pub loss: Tensor,
    pub metrics: Metrics,
}

/// The recipe's `actor` section: every loss knob with the reference defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LossConfig {
    /// PPO clip range ε around ratio 1.
    pub clip_ratio: f64,
    /// Advantages are clamped to ±this (and NFT scales its loss by it).
    pub adv_clip_max: f64,
    /// Add the KL-to-reference term (reference = the model with its adapters disabled).
    pub use_kl_loss: bool,
    /// Weight of the KL term when `use_kl_loss`.
    pub kl_loss_coef: f64,
    /// Flow-DPPO: drop a sample whose divergence reaches this and whose ratio moved the favoured way.
    pub kl_mask_threshold: f64,
    /// Flow-DPPO: divide the divergence by the step variance `(s·√−dt)²`.
    pub add_kl_coefficient: bool,
    /// DiffusionNFT and DGPO: weight of `mean((v_θ − v_ref)²)`.
    pub ref_kl_coef: f64,
    /// DiffusionNFT and DGPO: fraction of the N timesteps trained per sample.
    pub timestep_fraction: f64,
    /// DiffusionNFT and DGPO: how the old policy follows the trained one.
    pub old_policy_decay: OldPolicyDecay,
    /// DiffusionNFT and DGPO: refresh the old policy every this many training steps.
    pub old_policy_update_interval: u64,
    /// Add the on-policy distillation KL to the teachers (`model.teacher_path` / `model.teachers`)
    /// to a policy-gradient loss.
    pub use_distill_loss: bool,
    /// Weight of the distillation KL when `use_distill_loss`.
    pub distill_loss_coef: f64,
    /// Diffusion-DPO's knobs (`algorithm: dpo`).
    pub dpo: DpoConfig,
    /// DiffusionNFT's knobs (`algorithm: diffusion_nft`).
    pub nft: NftConfig,
    /// DGPO's knobs (`algorithm: dgpo`).
    pub dgpo: DgpoConfig,
    /// GARDO's knobs (`algorithm: gardo`).
    pub gardo: GardoConfig,
    /// DMD2's knobs (`algorithm: dmd2`).
    pub dmd2: Dmd2Config,
}

/// `actor.dpo`: Diffusion-DPO.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct DpoConfig {
    /// β of the preference loss.
    pub beta: f64,
}

impl Default for DpoConfig {
    fn default() -> Self {
        Self { beta: 2000.0 }
    }
}

/// `actor.nft`: DiffusionNFT.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct NftConfig {
    /// β mixing the trained and old velocities.
    pub beta: f64,
    /// How advantages become optimality probabilities.
    pub reward_mode: RewardMode,
}

impl Default for NftConfig {
    fn default() -> Self {
        Self { beta: 0.5, reward_mode: RewardMode::Continuous }
    }
}

/// `actor.dgpo`: DGPO.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct DgpoConfig {
    /// β of the group preference score.
    pub beta: f64,
    /// ε_c of the old-policy ratio (0: no clip).
    pub clip_range: f64,
    /// The rollout-schedule indices `[start, end)` trained timesteps are drawn from; unset: the
    /// whole schedule.
    pub train_timestep_range: Option<[usize; 2]>,
    /// How many timesteps are drawn per step (shared by the batch); unset:
    /// `max(1, ⌊range·timestep_fraction⌋)`.
    pub train_timestep_count: Option<usize>,
}

impl Default for DgpoConfig {
    fn default() -> Self {
        Self {
            beta: 100.0,
            clip_range: 0.01,
            train_timestep_range: None,
            train_timestep_count: None,
        }
    }
}

/// `actor.gardo`: GARDO.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct GardoConfig {
    /// A step whose mean gated KL exceeds this resets the anchor before the next step.
    pub kl_threshold: f64,
    /// The anchor is reset at the latest after this many steps.
    pub reset_interval: u64,
    /// The reward functions (by name) whose ranks, against the trained reward's, measure each
    /// sample's uncertainty; give them weight 0 to keep them out of the trained reward.
    pub proxy_rewards: Vec<String>,
    /// A transformers `CLIPModel` folder whose image embeddings measure diversity.
    pub features: Option<std::path::PathBuf>,
}

impl Default for GardoConfig {
    fn default() -> Self {
        Self { kl_threshold: 3e-4, reset_interval: 15, proxy_rewards: vec![], features: None }
    }
}

impl Default for LossConfig {
    fn default() -> Self {
        Self {
            clip_ratio: 1e-4,
            adv_clip_max: 5.0,
            use_kl_loss: false,
            kl_loss_coef: 0.001,
            kl_mask_threshold: 1e-5,
            add_kl_coefficient: true,
            ref_kl_coef: 1e-4,
            timestep_fraction: 1.0,
            old_policy_decay: OldPolicyDecay::LinearTo0_5,
            old_policy_update_interval: 1,
            use_distill_loss: false,
            distill_loss_coef: 1.0,
            dpo: DpoConfig::default(),
            nft: NftConfig::default(),
            dgpo: DgpoConfig::default(),
            gardo: GardoConfig::default(),
            dmd2: Dmd2Config::default(),
        }
    }
}

impl LossConfig {
    /// Checks ranges; the error names the key, the value and what is allowed.
    pub fn validate(&self) -> Result<(), ObjectiveError> {
        let positive = [
            ("clip_ratio", self.clip_ratio),
            ("adv_clip_max", self.adv_clip_max),
            ("dpo.beta", self.dpo.beta),
            ("nft.beta", self.nft.beta),
            ("dgpo.beta", self.dgpo.beta),
        ];
        for (key, value) in positive {
            if !(value > 0.0 && value.is_finite()) {
                return Err(ObjectiveError::invalid(key, value, "a finite number > 0"));
            }
        }
        let non_negative = [
            ("kl_loss_coef", self.kl_loss_coef),
            ("kl_mask_threshold", self.kl_mask_threshold),
            ("ref_kl_coef", self.ref_kl_coef),
            ("gardo.kl_threshold", self.gardo.kl_threshold),
            ("dgpo.clip_range", self.dgpo.clip_range),
            ("distill_loss_coef", self.distill_loss_coef),
        ];
        for (key, value) in non_negative {
            if !(value >= 0.0 && value.is_finite()) {
                return Err(ObjectiveError::invalid(key, value, "a finite number ≥ 0"));
            }
        }
        if !(self.timestep_fraction > 0.0 && self.timestep_fraction <= 1.0) {
            return Err(ObjectiveError::invalid(
                "timestep_fraction",
                self.timestep_fraction,
                "in (0, 1]",
            ));
        }
        if let Some([start, end]) = self.dgpo.train_timestep_range {
            if start >= end {
                return Err(ObjectiveError::invalid(
                    "dgpo.train_timestep_range",
                    format!("[{start}, {end}]"),
                    "[start, end) with start < end",
                ));
            }
        }
        if self.dgpo.train_timestep_count == Some(0) {
            return Err(ObjectiveError::invalid("dgpo.train_timestep_count", 0, "≥ 1"));
        }
        if self.old_policy_update_interval == 0 {
            return Err(ObjectiveError::invalid("old_policy_update_interval", 0, "≥ 1"));
        }
        self.dmd2.validate()
    }
}

/// Reads a 0-dim tensor as f64.
fn scalar(t: &Tensor) -> Result<f64, ObjectiveError> {
    Ok(t.f_double_value(&[])?)
}

/// Fraction of true values of a boolean tensor.
fn fraction(mask: &Tensor) -> Result<f64, ObjectiveError> {
    scalar(&mask.to_kind(Kind::Float).mean(Kind::Float))
}

/// A per-row quantity of shape (B,), (B, 1, …) or a scalar, as (B,) (or a 1-element tensor).
fn rows(t: &Tensor, b: i64, name: &str) -> Result<Tensor, ObjectiveError> {
    match t.numel() as i64 {
        n if n == b => Ok(t.reshape([b])),
        1 => Ok(t.reshape([1])),
        n => Err(ObjectiveError::Shape(format!("{name} has {n} values for a batch of {b}"))),
    }
}

/// The batch size of a (B, …) tensor with at least one non-batch dimension.
fn batch_rows(t: &Tensor, name: &str) -> Result<i64, ObjectiveError> {
    match t.size().as_slice() {
        [b, _, ..] => Ok(*b),
        other => Err(ObjectiveError::Shape(format!(
            "{name} must be (B, …) with a non-batch dimension, got {other:?}"
        ))),
    }
}

/// Mean over every non-batch dimension: (B, …) → (B,).
fn mean_elems(t: &Tensor) -> Tensor {
    let dims: Vec<i64> = (1..t.dim() as i64).collect();
    t.mean_dim(dims.as_slice(), false, t.kind())
}

/// Checks that every named tensor has the same shape as the first.
fn same_shape(tensors: &[(&str, &Tensor)]) -> Result<(), ObjectiveError> {
    let (first, reference) = tensors[0];
    for (name, t) in &tensors[1..] {
        if t.size() != reference.size() {
            return Err(ObjectiveError::Shape(format!(
                "{name} has shape {:?}, {first} has {:?}",
                t.size(),
                reference.size()
            )));
        }
    }
    Ok(())
}
