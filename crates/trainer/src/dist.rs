//! Data parallelism: this process's place among the ranks of a launched job (torchrun, Slurm,
//! `flowtune launch`), the share of a step it owns, and the few collectives the loop needs. A plain
//! process is a world of one and runs no collective at all.
//!
//! With sequence parallelism (`trainer.sequence_parallel_size` S > 1) the ranks form groups of S
//! consecutive ranks that work on the same samples (each rank on 1/S of every sample's tokens,
//! see `flowtune_models::sequence`): shares are per group, and what is gathered is taken once per
//! group. Gradients are still summed over every rank: a group's ranks hold partial sums of the
//! same samples' gradient.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use flowtune_config::{Recipe, Sharding, StateOffload};
use flowtune_dist::{Backend, DistEnv, ProcessGroup, ReduceOp};
use flowtune_models::sequence::{SequenceGroup, SequenceParallel};
use flowtune_models::shard::{ShardGroup, ShardMode};
use flowtune_models::{ModelError, TrainableDenoiser};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tch::{Device, Kind, Tensor};

use crate::reference::Reference;
use crate::TrainError;

/// Gradients are summed in flat buffers of at most this many elements.
const BUCKET_ELEMENTS: i64 = 1 << 24;

/// This process among the ranks of a job.
pub struct Comm {
    group: Option<Arc<ProcessGroup>>,
    /// This rank's sequence-parallel group, when S > 1.
    sequence: Option<Arc<ProcessGroup>>,
    /// Where this rank computes, and so where its collectives' tensors live.
    device: Device,
}

impl From<flowtune_dist::DistError> for TrainError {
    fn from(e: flowtune_dist::DistError) -> Self {
        TrainError::Distributed(format!(
            "{e} (a rank of this job stopped, hung or cannot be reached; the newest complete checkpoint stays loadable: rerun with trainer.resume: auto)"
        ))
    }
}

impl Comm {
    /// A world of one on `device`.
    pub fn single(device: Device) -> Self {
        Self { group: None, sequence: None, device }
    }

    /// Joins the job the launcher's variables describe (NCCL for a CUDA `device`, where rank
    /// computes on `cuda:LOCAL_RANK`; Gloo otherwise), or a world of one when there is none, and
    /// this rank's group of `sequence` consecutive ranks (`trainer.sequence_parallel_size`).
    /// Collectives wait at most `timeout`.
    pub fn from_env(
        device: Device,
        timeout: Duration,
        sequence: usize,
    ) -> Result<Self, TrainError> {
        let env = DistEnv::detect()?;
        let world = env.as_ref().map_or(1, |e| e.world_size);
        if sequence > 1 && world % sequence != 0 {
            return Err(TrainError::Invalid(format!(
                "trainer.sequence_parallel_size {sequence} does not divide the {world} rank(s) of this job (launch a multiple of {sequence} ranks, e.g. flowtune launch --nproc {sequence})"
            )));
        }
        let Some(env) = env else { return Ok(Self::single(device)) };
        let (backend, device) = match device {
            Device::Cuda(_) => (Backend::Nccl, Device::Cuda(env.local_rank)),
            _ => (Backend::Gloo, device),
        };
        let group = ProcessGroup::new(&env, backend, timeout).map_err(|e| {
            TrainError::Distributed(format!(
                "rank {} of {} could not join the job at {}:{}: {e}",
                env.rank, env.world_size, env.master_addr, env.master_port
            ))
        })?;
        let sequence = match sequence {
            1 => None,
            s => {
                let first = env.rank / s * s;
                let members: Vec<usize> = (first..first + s).collect();
                Some(Arc::new(group.sub_group("sequence", &members)?))
            }
        };
        Ok(Self { group: Some(Arc::new(group)), sequence, device })
    }

    /// The device this rank computes on.
    pub fn device(&self) -> Device {
        self.device
    }

    pub fn rank(&self) -> usize {
        self.group.as_ref().map_or(0, |g| g.rank())
    }

    pub fn size(&self) -> usize {
        self.group.as_ref().map_or(1, |g| g.size())
    }

    /// Rank 0, the one that writes files.
    pub fn is_main(&self) -> bool {
        self.rank() == 0
    }

    /// Ranks per sequence-parallel group (S; 1 without sequence parallelism).
    pub fn sequence_size(&self) -> usize {
        self.sequence.as_ref().map_or(1, |g| g.size())
    }

    /// Whether this rank is the first of its sequence-parallel group (always, without one).
    pub fn leads_group(&self) -> bool {
        self.rank().is_multiple_of(self.sequence_size())
    }

    /// How many groups share out the samples (the world size over S).
    pub fn groups(&self) -> usize {
        self.size() / self.sequence_size()
    }

    /// This rank's group's contiguous share `[g·n/G, (g+1)·n/G)` of `n` units.
    pub fn share(&self, n: usize) -> Range<usize> {
        let (g, groups) = (self.rank() / self.sequence_size(), self.groups());
        g * n / groups..(g + 1) * n / groups
    }

    /// Every group's `value` (its first rank's), in rank order, read back as `T` (the owned
    /// form of the value's type).
    pub fn gather<T: DeserializeOwned>(
        &self,
        value: &impl Serialize,
    ) -> Result<Vec<T>, TrainError> {
        let bytes = postcard::to_stdvec(value)
            .map_err(|e| TrainError::Distributed(format!("encoding a gathered value: {e}")))?;
        let Some(group) = &self.group else {
            return decode(&bytes).map(|v| vec![v]);
        };
        let all = group.all_gather_bytes(&bytes)?;
        all.iter().step_by(self.sequence_size()).map(|b| decode(b)).collect()
    }

    /// The rows of `t` from every group (its first rank's), concatenated in rank order (row
    /// counts may differ).
    pub fn gather_rows(&self, t: &Tensor) -> Result<Tensor, TrainError> {
        let Some(group) = &self.group else { return Ok(t.shallow_clone()) };
        let rows: Vec<i64> = group
            .all_gather_bytes(&t.size()[0].to_le_bytes())?
            .iter()
            .map(|b| i64::from_le_bytes(b[..8].try_into().expect("8 bytes")))
            .collect();
        let most = *rows.iter().max().expect("a job has ranks");
        let mut shape = t.size();
        shape[0] = most;
        let padded = Tensor::zeros(&shape, (t.kind(), t.device()));
        padded.narrow(0, 0, t.size()[0]).copy_(t);
        shape[0] = most * rows.len() as i64;
        let mut all = Tensor::zeros(&shape, (t.kind(), t.device()));
        group.all_gather_into(&mut all, &padded)?;
        let parts: Vec<Tensor> = (0..rows.len())
            .step_by(self.sequence_size())
            .map(|r| all.narrow(0, r as i64 * most, rows[r]))
            .collect();
        Ok(Tensor::cat(&parts, 0))
    }

    /// Whether this job shards the transformer blocks (`trainer.sharding: frozen` or `full`
    /// over several ranks, or in one process whose slices live on the host, `trainer.offload:
    /// all`, so that its device holds one block at a time).
    pub fn shards_blocks(&self, recipe: &Recipe) -> bool {
        let on_host = recipe.trainer.offload == StateOffload::All;
        (self.size() > 1 || on_host)
            && matches!(recipe.sharding(), Sharding::Frozen | Sharding::Full)
    }

    /// Splits the denoiser (and a frozen reference copy) over the ranks as the recipe says: every
    /// sample's tokens over this rank's sequence-parallel group, and when this job shards the
    /// blocks, this rank's share of the block weights only.
    pub(crate) fn shard_blocks(
        &self,
        recipe: &Recipe,
        denoiser: &dyn TrainableDenoiser,
        reference: Option<&Reference>,
    ) -> Result<(), TrainError> {
        if let Some(sequence) = &self.sequence {
            let split = |model: &dyn TrainableDenoiser| {
                let ranks = SequenceParallel(Arc::new(SequenceRanks(sequence.clone())));
                model.sequence_parallel(ranks).map_err(|e| {
                    TrainError::Invalid(format!(
                        "{} (trainer.sequence_parallel_size): {e}",
                        model.describe()
                    ))
                })
            };
            split(denoiser)?;
            if let Some(Reference::Frozen(copy)) = reference {
                split(copy.as_ref())?;
            }
        }
        if !self.shards_blocks(recipe) {
            return Ok(());
        }
        let group: Arc<dyn ShardGroup> = match &self.group {
            Some(group) => Arc::new(BlockGroup(group.clone())),
            None => Arc::new(Alone),
        };
        let mode = match recipe.sharding() {
            Sharding::Full => ShardMode::Full { exact: recipe.trainer.exact_gradient_sum },
            _ => ShardMode::Frozen,
        };
        let on_host = recipe.trainer.offload == StateOffload::All;
        denoiser.shard_blocks(group.clone(), mode, on_host)?;
        if let Some(Reference::Frozen(copy)) = reference {
            copy.shard_blocks(group, ShardMode::Frozen, false)?;
        }
        Ok(())
    }

    /// `x` summed over the ranks.
    pub fn sum_f64(&self, x: f64) -> Result<f64, TrainError> {
        let Some(group) = &self.group else { return Ok(x) };
        let mut t = Tensor::from_slice(&[x]).to_device(self.device);
        group.all_reduce_(&mut t, ReduceOp::Sum)?;
        Ok(t.double_value(&[0]))
    }

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

    /// Whether `flag` holds on any rank.
    pub fn any(&self, flag: bool) -> Result<bool, TrainError> {
        let Some(group) = &self.group else { return Ok(flag) };
        let mut t = Tensor::from_slice(&[flag as u8 as f32]).to_device(self.device);
        group.all_reduce_(&mut t, ReduceOp::Max)?;
        Ok(t.double_value(&[0]) > 0.0)
    }

    /// `t` as rank `root` has it, on every rank.
    pub fn broadcast_(&self, t: &mut Tensor, root: usize) -> Result<(), TrainError> {
        match &self.group {
            Some(group) => Ok(group.broadcast_(t, root)?),
            None => Ok(()),
        }
    }

    /// Waits until every rank is here.
    pub fn barrier(&self) -> Result<(), TrainError> {
        match &self.group {
            Some(group) => Ok(group.barrier()?),
            None => Ok(()),
        }
    }
}

/// The job's process group as sharded blocks see it.
struct BlockGroup(Arc<ProcessGroup>);

impl ShardGroup for BlockGroup {
    fn rank(&self) -> usize {
        self.0.rank()
    }

    fn size(&self) -> usize {
        self.0.size()
    }

    fn all_gather_into(&self, out: &mut Tensor, shard: &Tensor) -> Result<(), String> {
        self.0.all_gather_into(out, shard).map_err(|e| e.to_string())
    }

    fn reduce_scatter_into(&self, out: &mut Tensor, full: &Tensor) -> Result<(), String> {
        self.0.reduce_scatter_into(out, full, ReduceOp::Sum).map_err(|e| e.to_string())
    }
}

/// The one rank of a process without a group: its slice is the whole block.
struct Alone;

impl ShardGroup for Alone {
    fn rank(&self) -> usize {
        0
    }

    fn size(&self) -> usize {
        1
    }

    fn all_gather_into(&self, out: &mut Tensor, shard: &Tensor) -> Result<(), String> {
        out.f_copy_(shard).map_err(|e| e.to_string())
    }

    fn reduce_scatter_into(&self, out: &mut Tensor, full: &Tensor) -> Result<(), String> {
        out.f_copy_(full).map_err(|e| e.to_string())
    }
}

/// A sequence-parallel group as the model's attention sees it.
struct SequenceRanks(Arc<ProcessGroup>);

impl SequenceGroup for SequenceRanks {
    fn rank(&self) -> usize {
        self.0.rank()
    }

    fn size(&self) -> usize {
        self.0.size()
    }

    fn exchange(&self, x: &Tensor, scatter: i64, gather: i64) -> Result<Tensor, ModelError> {
        let failed = |e| ModelError::Collective(format!("sequence-parallel attention: {e}"));
        self.0.exchange(x, scatter, gather).map_err(failed)
    }

    fn all_gather(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        let mut shape = x.size();
        shape[0] *= self.0.size() as i64;
        let mut out = Tensor::zeros(&shape, (x.kind(), x.device()));
        self.0.all_gather_into(&mut out, x).map_err(|e| ModelError::Collective(e.to_string()))?;
        Ok(out)
    }
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, TrainError> {
    postcard::from_bytes(bytes)
        .map_err(|e| TrainError::Distributed(format!("decoding a gathered value: {e}")))
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
