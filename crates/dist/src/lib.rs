//! Distributed collectives for flowtune, through PyTorch's own c10d (the torch 2.11 wheel's
//! libtorch): a TCPStore rendezvous, then a Gloo (CPU) or NCCL (GPU) process group, behind a small
//! C++ shim (`csrc/shim.cpp`). [`DistEnv`] reads where this process sits from torchrun's, Slurm's or
//! OpenMPI's variables; [`ProcessGroup`] runs blocking collectives on `tch::Tensor`s.
//!
//! Every collective waits for completion with the group's timeout; a dead or hung peer yields a
//! [`DistError`], never a hang or an abort.

mod env;
mod error;
mod ffi;
mod group;

pub use env::DistEnv;
pub use error::DistError;
pub use group::ProcessGroup;

/// Which c10d process group carries the collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Gloo over TCP: CPU tensors; what the tests and CPU runs use.
    Gloo,
    /// NCCL: CUDA tensors, one GPU per process (the GPU is `local_rank`).
    Nccl,
}

/// How [`ProcessGroup::all_reduce_`] and [`ProcessGroup::reduce_scatter_into`] combine ranks' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise mean over ranks (floating-point tensors; Gloo computes it as a sum, then divides).
    Avg,
    /// Element-wise maximum.
    Max,
    /// Element-wise minimum.
    Min,
}
