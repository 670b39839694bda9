//! Gradients over the ranks: summed in flat f32 buckets, or exactly (in f64, added in rank order),
//! and a sharded optimizer's updates sent from the rank that owns each parameter.

use std::collections::{BTreeMap, BTreeSet};

use flowtune_dist::ReduceOp;
use tch::{Device, Kind, Tensor};

use super::Comm;
use crate::TrainError;

/// Gradients are summed in flat buffers of at most this many elements.
const BUCKET_ELEMENTS: i64 = 1 << 24;

impl Comm {
    /// Sums the gradients of `params` over the ranks, in flat f32 buckets (a bf16 gradient is
    /// rounded once, after the sum). A parameter without a gradient here takes zeros; those
    /// without one on any rank are returned (they do not step).
    pub fn sum_gradients(
        &self,
        params: &BTreeMap<String, Tensor>,
    ) -> Result<BTreeSet<String>, TrainError> {
        let Some(group) = &self.group else { return Ok(BTreeSet::new()) };
        let defined: Vec<bool> = params.values().map(|p| p.grad().defined()).collect();
        let had = self.count_ranks(&defined)?;
        create_missing_gradients(params);
        let grads: Vec<Tensor> = params.values().map(|p| p.grad()).collect();
        in_buckets(&grads, Some(Kind::Float), |flat| group.all_reduce_(flat, ReduceOp::Sum))?;
        Ok(params.keys().zip(had).filter(|(_, n)| *n == 0).map(|(k, _)| k.clone()).collect())
    }

    /// Puts the sum over ranks of `sum` (each rank's gradients in f64, see [`ExactSum`]) into the
    /// gradients of `params`, adding the ranks in rank order and rounding once. Returns the
    /// parameters no rank had a gradient for.
    pub fn sum_exact(
        &self,
        params: &BTreeMap<String, Tensor>,
        sum: ExactSum,
    ) -> Result<BTreeSet<String>, TrainError> {
        let had = self.count_ranks(&sum.had)?;
        let mut flat = sum.flat;
        if let Some(group) = &self.group {
            let mut all = Tensor::zeros(
                [flat.numel() as i64 * group.size() as i64],
                (Kind::Double, self.device),
            );
            group.all_gather_into(&mut all, &flat)?;
            let rows = all.view([group.size() as i64, -1]);
            flat = rows.get(0);
            for r in 1..group.size() as i64 {
                flat += rows.get(r);
            }
        }
        create_missing_gradients(params);
        let _guard = tch::no_grad_guard();
        let mut offset = 0;
        for p in params.values() {
            let n = p.numel() as i64;
            p.grad().copy_(&flat.narrow(0, offset, n).view_as(p));
            offset += n;
        }
        Ok(params.keys().zip(had).filter(|(_, n)| *n == 0).map(|(k, _)| k.clone()).collect())
    }

    /// For each flag, on how many ranks it holds.
    fn count_ranks(&self, flags: &[bool]) -> Result<Vec<i64>, TrainError> {
        let counts: Vec<f32> = flags.iter().map(|&f| f as u8 as f32).collect();
        let Some(group) = &self.group else { return Ok(flags.iter().map(|&f| f as i64).collect()) };
        let mut t = Tensor::from_slice(&counts).to_device(self.device);
        group.all_reduce_(&mut t, ReduceOp::Sum)?;
        Ok(Vec::<f32>::try_from(t.to_device(Device::Cpu))?.into_iter().map(|n| n as i64).collect())
    }

    /// Sends each parameter from the rank that owns it (a sharded optimizer's update) to all.
    pub fn broadcast_from_owners(
        &self,
        params: &BTreeMap<String, Tensor>,
        owners: &BTreeMap<String, usize>,
    ) -> Result<(), TrainError> {
        let Some(group) = &self.group else { return Ok(()) };
        let _guard = tch::no_grad_guard();
        for root in 0..self.size() {
            let mine: Vec<Tensor> = params
                .iter()
                .filter(|(n, _)| owners[*n] == root)
                .map(|(_, p)| p.shallow_clone())
                .collect();
            in_buckets(&mine, None, |flat| group.broadcast_(flat, root))?;
        }
        Ok(())
    }
}

/// Gives every parameter without a gradient a zero one (so that every rank reduces the same
/// tensors).
fn create_missing_gradients(params: &BTreeMap<String, Tensor>) {
    let missing: Vec<&Tensor> = params.values().filter(|p| !p.grad().defined()).collect();
    if !missing.is_empty() {
        // Accumulates zeros into each missing gradient, creating it.
        let zero: Tensor = missing.iter().map(|p| p.sum(Kind::Float) * 0.0).sum();
        zero.backward();
    }
}

/// A step's gradients summed in f64 as its micro-batches come ([`ExactSum::absorb`]), to be
/// reduced over the ranks by [`Comm::sum_exact`]. Adding f32 values in f64 is exact unless they
/// differ by more than 2²⁹ in scale, so the sum does not depend on the order of its parts.
pub struct ExactSum {
    /// Every parameter's gradient sum, flat, in the parameters' order.
    flat: Tensor,
    /// Which parameters got a gradient from some micro-batch.
    had: Vec<bool>,
}

impl ExactSum {
    /// Zero sums for `params`.
    pub fn new(params: &BTreeMap<String, Tensor>) -> Self {
        let n: i64 = params.values().map(|p| p.numel() as i64).sum();
        let device = params.values().next().map_or(Device::Cpu, Tensor::device);
        Self { flat: Tensor::zeros([n], (Kind::Double, device)), had: vec![false; params.len()] }
    }

    /// Adds the gradients of `params` (one micro-batch's) and drops them.
    pub fn absorb(&mut self, params: &BTreeMap<String, Tensor>) {
        let _guard = tch::no_grad_guard();
        let mut offset = 0;
        for (i, p) in params.values().enumerate() {
            let n = p.numel() as i64;
            let g = p.grad();
            if g.defined() {
                let _ =
                    self.flat.narrow(0, offset, n).f_add_(&g.reshape([-1]).to_kind(Kind::Double));
                self.had[i] = true;
                flowtune_recompute::clear_grad(p);
            }
            offset += n;
        }
    }
}

/// Runs the in-place collective `op` on `tensors` through flat buffers of at most
/// [`BUCKET_ELEMENTS`] elements each, in `kind` (None: one bucket per kind of tensor), and copies
/// the results back (rounded to each tensor's kind).
fn in_buckets(
    tensors: &[Tensor],
    kind: Option<Kind>,
    mut op: impl FnMut(&mut Tensor) -> Result<(), flowtune_dist::DistError>,
) -> Result<(), TrainError> {
    let mut run = |bucket: &[&Tensor]| -> Result<(), TrainError> {
        let parts: Vec<Tensor> =
            bucket.iter().map(|t| t.reshape([-1]).to_kind(kind.unwrap_or(t.kind()))).collect();
        let mut flat = Tensor::cat(&parts, 0);
        op(&mut flat)?;
        let _guard = tch::no_grad_guard();
        let mut offset = 0;
        for t in bucket {
            let n = t.numel() as i64;
            t.shallow_clone().copy_(&flat.narrow(0, offset, n).view_as(t));
            offset += n;
        }
        Ok(())
    };
    let mut bucket: Vec<&Tensor> = vec![];
    let mut size = 0;
    for t in tensors {
        let same = kind.is_some() || bucket.first().is_none_or(|b| b.kind() == t.kind());
        if !bucket.is_empty() && (!same || size + t.numel() as i64 > BUCKET_ELEMENTS) {
            run(&bucket)?;
            (bucket, size) = (vec![], 0);
        }
        size += t.numel() as i64;
        bucket.push(t);
    }
    if !bucket.is_empty() {
        run(&bucket)?;
    }
    Ok(())
}
