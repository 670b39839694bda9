//! Data parallelism: this process's place among the ranks of a launched job (torchrun, Slurm,
//! `flowtune launch`), the share of a step it owns, and the few collectives the loop needs; the
//! gradient sums are [`grads`]'s, laying the model out over the ranks [`parallelize`]'s, the
//! exchange between rollout and training ranks (`trainer.rollout_ranks`) [`handoff`]'s. A plain
//! process is a world of one and runs no collective at all.
//!
//! With sequence parallelism (`trainer.sequence_parallel_size` S > 1) the ranks form groups of S
//! consecutive ranks that work on the same samples (each rank on 1/S of every sample's tokens,
//! see `flowtune_models::sequence`): shares are per group, and what is gathered is taken once per
//! group. Gradients are still summed over every rank: a group's ranks hold partial sums of the
//! same samples' gradient.

mod grads;
mod handoff;
mod parallelize;

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use flowtune_dist::{Backend, DistEnv, ProcessGroup, ReduceOp};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tch::{Device, Tensor};

use crate::TrainError;

pub use grads::ExactSum;
pub use handoff::Handoff;

/// This process among the ranks of a job.
pub struct Comm {
    group: Option<Arc<ProcessGroup>>,
    /// This rank's sequence-parallel group, when S > 1.
    sequence: Option<Arc<ProcessGroup>>,
    /// Where this rank computes, and so where its collectives' tensors live.
    device: Device,
    /// In a job split into rollout and training ranks, this rank's side of the exchange; `group`
    /// is then its own side's ranks.
    handoff: Option<Handoff>,
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
        Self { group: None, sequence: None, device, handoff: None }
    }

    /// Joins the job the launcher's variables describe (NCCL for a CUDA `device`, where rank
    /// computes on `cuda:LOCAL_RANK`; Gloo otherwise), or a world of one when there is none, and
    /// this rank's group of `sequence` consecutive ranks (`trainer.sequence_parallel_size`). With
    /// `rollout` ranks (`trainer.rollout_ranks`) the first ones only sample and the others train:
    /// the collectives run over this rank's side, and [`Self::handoff`] joins the two.
    /// Collectives wait at most `timeout`.
    pub fn from_env(
        device: Device,
        timeout: Duration,
        sequence: usize,
        rollout: usize,
    ) -> Result<Self, TrainError> {
        let env = DistEnv::detect()?;
        let world = env.as_ref().map_or(1, |e| e.world_size);
        if rollout >= world {
            return Err(TrainError::Invalid(format!(
                "trainer.rollout_ranks {rollout} leaves no training rank in a job of {world} rank(s); launch more (e.g. flowtune launch --nproc {})",
                rollout + 1
            )));
        }
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
        let group = Arc::new(group);
        if rollout == 0 {
            return Ok(Self { group: Some(group), sequence, device, handoff: None });
        }
        let side: Vec<usize> = match env.rank < rollout {
            true => (0..rollout).collect(),
            false => (rollout..world).collect(),
        };
        let side = Arc::new(group.sub_group("side", &side)?);
        let handoff = Handoff::join(&group, rollout, device)?;
        Ok(Self { group: Some(side), sequence, device, handoff: Some(handoff) })
    }

    /// The exchange with the other kind of ranks, in a job split into rollout and training ranks.
    pub fn handoff(&self) -> Option<&Handoff> {
        self.handoff.as_ref()
    }

    /// Whether this rank only samples (one of `trainer.rollout_ranks`).
    pub fn is_rollout(&self) -> bool {
        self.handoff.as_ref().is_some_and(Handoff::is_rollout)
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

    /// Rank 0 (of the training ranks, in a split job), the one that writes files.
    pub fn is_main(&self) -> bool {
        self.rank() == 0 && !self.is_rollout()
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

    /// `x` summed over the ranks.
    pub fn sum_f64(&self, x: f64) -> Result<f64, TrainError> {
        let Some(group) = &self.group else { return Ok(x) };
        let mut t = Tensor::from_slice(&[x]).to_device(self.device);
        group.all_reduce_(&mut t, ReduceOp::Sum)?;
        Ok(t.double_value(&[0]))
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

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, TrainError> {
    postcard::from_bytes(bytes)
        .map_err(|e| TrainError::Distributed(format!("decoding a gathered value: {e}")))
}
