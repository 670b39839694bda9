//! TEMPORARY single-process stand-in, replaced by the c10d crate being built on branch dist-crate.
use std::time::Duration;
use tch::Tensor;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Gloo,
    Nccl,
}
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Avg,
    Max,
    Min,
}
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error("{0}")]
    Other(String),
}
#[derive(Debug, Clone, PartialEq)]
pub struct DistEnv {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    pub agent_store: bool,
    pub restart: u32,
}
impl DistEnv {
    pub fn detect() -> Result<Option<DistEnv>, DistError> {
        Ok(None)
    }
}
pub struct ProcessGroup {
    rank: usize,
    size: usize,
}
impl ProcessGroup {
    pub fn new(env: &DistEnv, _backend: Backend, _timeout: Duration) -> Result<Self, DistError> {
        Ok(Self { rank: env.rank, size: env.world_size })
    }
    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn size(&self) -> usize {
        self.size
    }
    pub fn all_reduce_(&self, _t: &mut Tensor, _op: ReduceOp) -> Result<(), DistError> {
        Ok(())
    }
    pub fn broadcast_(&self, _t: &mut Tensor, _root: usize) -> Result<(), DistError> {
        Ok(())
    }
    pub fn all_gather_into(&self, out: &mut Tensor, shard: &Tensor) -> Result<(), DistError> {
        out.copy_(shard);
        Ok(())
    }
    pub fn barrier(&self) -> Result<(), DistError> {
        Ok(())
    }
    pub fn all_gather_bytes(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, DistError> {
        Ok(vec![bytes.to_vec()])
    }
}
