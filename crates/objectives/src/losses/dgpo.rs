//! DGPO (`docs/spec/algorithms.md` §6, "dgpo"): group-level direct preference on re-noised clean
//! samples. Each sample's flow-matching error is weighted by its advantage and by a sigmoid of its
//! whole group's preference score; samples whose old-policy ratio left the trust region in the
//! favoured direction keep a detached error.

use tch::{Kind, Tensor};

use super::{fraction, mean_elems, rows, same_shape, scalar, LossOutput, Metrics};
use crate::ObjectiveError;

/// One micro-batch of whole prompt groups, re-noised at one shared timestep with one noise per
/// group.
pub struct DgpoBatch<'a> {
    /// Clean latents x0 (B, …).
    pub x0: &'a Tensor,
    /// The noise ε of `x_t = (1 − t)·x0 + t·ε` (B, …); the target is `ε − x0`.
    pub noise: &'a Tensor,
    /// Group advantages (B,).
    pub advantages: &'a Tensor,
    /// Each row's group, 0…G−1 (B,, int64); every group of the batch is whole.
    pub groups: &'a Tensor,
    /// Trained velocity (B, …), with gradient.
    pub policy_pred: &'a Tensor,
    /// Old (sampling) policy's velocity (B, …).
    pub old_pred: &'a Tensor,
    /// Reference velocity (B, …).
    pub ref_pred: &'a Tensor,
}

/// The settings of [`dgpo_loss`].
#[derive(Debug, Clone, Copy)]
pub struct DgpoSettings {
    pub beta: f64,
    /// ε_c of the old-policy ratio; 0 turns the clip off.
    pub clip_range: f64,
    pub ref_kl_coef: f64,
    pub adv_clip_max: f64,
}

/// `d_i = mean_elems((ε − x0 − v_θ)²)`, `s_G = β/|G|·Σ_{i∈G} A_i·(d_i − d_i^ref)` (detached),
/// `L = mean_i(σ(s_G)·A_i·d_i′) + ref_kl_coef·mean((v_θ − v_ref)²)`, where `d_i′` is `d_i` detached
/// when the row is clipped: `ρ_i > 1 + ε_c` if `A_i > 0`, else `ρ_i < 1 − ε_c`, with
/// `ρ_i = exp(d_i^old − d_i)` (the reference's rule: an A = 0 row counts as clipped when its ratio
/// fell, though its term is 0 either way). Metrics `actor/{policy_loss,kl_loss,dsm_loss}`,
/// `actor/clip_frac` (the fraction of clipped rows) and `actor/group_weight_{mean,dev}` (mean
/// σ(s_G) and mean |σ(s_G) − ½|, over rows).
pub fn dgpo_loss(batch: &DgpoBatch<'_>, s: DgpoSettings) -> Result<LossOutput, ObjectiveError> {
    same_shape(&[
        ("x0", batch.x0),
        ("noise", batch.noise),
        ("policy_pred", batch.policy_pred),
        ("old_pred", batch.old_pred),
        ("ref_pred", batch.ref_pred),
    ])?;
    let b = super::batch_rows(batch.x0, "x0")?;
    let a = rows(batch.advantages, b, "advantages")?.clamp(-s.adv_clip_max, s.adv_clip_max);
    let groups = rows(batch.groups, b, "groups")?.to_kind(Kind::Int64);
    let target = batch.noise - batch.x0;
    let dsm = mean_elems(&(&target - batch.policy_pred).square());
    let ref_dsm = mean_elems(&(&target - batch.ref_pred).square()).detach();
    let old_dsm = mean_elems(&(&target - batch.old_pred).square()).detach();
    let count = groups.max().int64_value(&[]) + 1;
    let kind = dsm.kind();
    let zeros = Tensor::zeros([count], (kind, dsm.device()));
    let size = zeros.index_add(0, &groups, &Tensor::ones([b], (kind, dsm.device())));
    let per = &a * (dsm.detach() - &ref_dsm) * s.beta;
    let score = zeros.index_add(0, &groups, &per) / &size;
    let weight = score.sigmoid().index_select(0, &groups).detach();
    let ratio = (&old_dsm - dsm.detach()).exp();
    let clipped = if s.clip_range > 0.0 {
        ratio.gt(1.0 + s.clip_range).where_self(&a.gt(0.0), &ratio.lt(1.0 - s.clip_range))
    } else {
        Tensor::zeros([b], (Kind::Bool, dsm.device()))
    };
    let trained = dsm.detach().where_self(&clipped, &dsm);
    let policy = (&weight * &a * trained).mean(kind);
    let kl = (batch.policy_pred - batch.ref_pred).square().mean(kind);
    let loss = &policy + &kl * s.ref_kl_coef;
    let metrics = Metrics::from([
        ("actor/policy_loss".to_string(), scalar(&policy)?),
        ("actor/kl_loss".to_string(), scalar(&kl)?),
        ("actor/dsm_loss".to_string(), scalar(&dsm.mean(kind))?),
        ("actor/clip_frac".to_string(), fraction(&clipped)?),
        ("actor/group_weight_mean".to_string(), scalar(&weight.mean(kind))?),
        ("actor/group_weight_dev".to_string(), scalar(&(&weight - 0.5).abs().mean(kind))?),
    ]);
    Ok(LossOutput { loss, metrics })
}
