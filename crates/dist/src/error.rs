//! The crate's error type.
use std::time::Duration;

/// What failed in launcher detection, rendezvous or a collective, and why.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    /// A launcher variable holds something unusable, e.g. `RANK=abc is not a number`.
    #[error("{var}={value} is not {expected}")]
    BadVar {
        /// The variable's name.
        var: String,
        /// Its value.
        value: String,
        /// What it should have been ("a number", "a port number", …).
        expected: &'static str,
    },
    /// A variable the detected launcher should have set is missing.
    #[error("{var} is not set ({why})")]
    MissingVar {
        /// The variable's name.
        var: &'static str,
        /// Which launcher was detected, and what to do.
        why: &'static str,
    },
    /// The variables are each valid but contradict one another (e.g. rank ≥ world size).
    #[error("inconsistent launch variables: {0}")]
    Inconsistent(String),
    /// `Backend::Nccl` was asked for on a machine without a visible CUDA device.
    #[error("the NCCL backend needs a GPU, but no GPU (CUDA device) is visible to this process")]
    NoGpu,
    /// The TCPStore rendezvous or the process group's construction failed.
    #[error("rendezvous of rank {rank}/{world_size} at {addr} failed: {message}")]
    Rendezvous {
        /// This process's rank.
        rank: usize,
        /// The job's world size.
        world_size: usize,
        /// `master_addr:master_port`.
        addr: String,
        /// c10d's message.
        message: String,
    },
    /// A collective did not complete within the group's timeout.
    #[error("{op} timed out after {}s: {message}", after.as_secs_f64())]
    Timeout {
        /// The collective (`all_reduce`, `barrier`, …).
        op: &'static str,
        /// The group's timeout.
        after: Duration,
        /// c10d's message.
        message: String,
    },
    /// A collective failed (a peer died, a backend refused the tensor, …).
    #[error("{op} failed: {message}")]
    Collective {
        /// The collective.
        op: &'static str,
        /// c10d's message.
        message: String,
    },
    /// A tensor argument cannot be used as given (not contiguous, wrong size, dtype or device).
    #[error("{op}: {message}")]
    BadTensor {
        /// The collective.
        op: &'static str,
        /// What is wrong, with the expected and the found values.
        message: String,
    },
}
