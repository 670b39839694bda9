//! Diffusion-DPO (`docs/spec/algorithms.md` §6): preference pairs scored by how much better
//! the policy denoises the chosen image than the rejected one, relative to the reference.

use tch::{Kind, Tensor};

use super::{fraction, mean_elems, same_shape, scalar, LossOutput, Metrics};
use crate::ObjectiveError;

/// One micro-batch of pairs, rows interleaved `[chosen₀, rejected₀, chosen₁, rejected₁, …]`; each
/// pair shares its noise and timestep.
pub struct DpoBatch<'a> {
    /// Clean latents x0 (2P, …).
    pub latents: &'a Tensor,
    /// The noise ε that made `x_t` (2P, …).
    pub noise: &'a Tensor,
    /// Policy velocity at `x_t` (2P, …), with gradient.
    pub model_pred: &'a Tensor,
    /// Reference velocity at `x_t` (2P, …).
    pub ref_pred: &'a Tensor,
}

/// `L = −mean(log σ(z))`, `z = −½β·((e_w − e_w^ref) − (e_l − e_l^ref))`, `e = mean((v − (ε − x0))²)`.
/// Metrics `actor/dpo_loss`, `actor/implicit_acc`, `actor/rewards/{chosen,rejected,margins}`.
pub fn dpo_loss(batch: &DpoBatch<'_>, beta: f64) -> Result<LossOutput, ObjectiveError> {
    same_shape(&[
        ("latents", batch.latents),
        ("noise", batch.noise),
        ("model_pred", batch.model_pred),
        ("ref_pred", batch.ref_pred),
    ])?;
    let rows = super::batch_rows(batch.latents, "latents")?;
    if rows == 0 || rows % 2 != 0 {
        return Err(ObjectiveError::Shape(format!(
            "DPO needs (chosen, rejected) pairs: got {rows} rows"
        )));
    }
    let target = batch.noise - batch.latents;
    let err = mean_elems(&(batch.model_pred - &target).square()).reshape([rows / 2, 2]);
    let ref_err = mean_elems(&(batch.ref_pred - &target).square()).reshape([rows / 2, 2]).detach();
    let scale = -0.5 * beta;
    let chosen = (err.select(1, 0) - ref_err.select(1, 0)) * scale;
    let rejected = (err.select(1, 1) - ref_err.select(1, 1)) * scale;
    let z = &chosen - &rejected;
    let loss = -z.log_sigmoid().mean(Kind::Float);
    let metrics = Metrics::from([
        ("actor/dpo_loss".to_string(), scalar(&loss)?),
        ("actor/implicit_acc".to_string(), fraction(&z.gt(0.0))?),
        ("actor/rewards/chosen".to_string(), scalar(&chosen.mean(Kind::Float))?),
        ("actor/rewards/rejected".to_string(), scalar(&rejected.mean(Kind::Float))?),
        ("actor/rewards/margins".to_string(), scalar(&z.mean(Kind::Float))?),
    ]);
    Ok(LossOutput { loss, metrics })
}
