//! A c10d process group: rendezvous, blocking collectives with a timeout, clean shutdown.
use crate::ffi::{self, take_error};
use crate::{Backend, DistEnv, DistError, ReduceOp};
use std::ffi::CString;
use std::time::Duration;
use tch::{Device, Kind, Tensor};

/// A Gloo or NCCL process group over a TCPStore rendezvous. It owns its store; dropping it shuts the
/// backend down (NCCL communicators included). Collectives block until done or the timeout passes,
/// and must be called in the same order on every rank.
pub struct ProcessGroup {
    raw: *mut ffi::Group,
    rank: usize,
    size: usize,
    backend: Backend,
    /// Where [`ProcessGroup::all_gather_bytes`] puts its tensors: the CPU (Gloo) or this rank's GPU.
    device: Device,
    timeout: Duration,
}

// SAFETY: c10d process groups are thread-safe (torch.distributed calls them from any thread); the
// handle is only freed in Drop.
unsafe impl Send for ProcessGroup {}
unsafe impl Sync for ProcessGroup {}

impl ProcessGroup {
    /// Rendezvous over a TCPStore at master_addr:master_port (rank 0 serves it unless agent_store),
    /// keys prefixed "flowtune/<restart>", then the backend's process group. `timeout` bounds the
    /// rendezvous and every collective.
    ///
    /// With [`Backend::Nccl`] the current CUDA device becomes `env.local_rank`, and
    /// `TORCH_NCCL_ASYNC_ERROR_HANDLING` is set to 2 (clean up only), so that a timeout surfaces as
    /// an error from the collective instead of the watchdog killing the process.
    pub fn new(env: &DistEnv, backend: Backend, timeout: Duration) -> Result<Self, DistError> {
        let device = match backend {
            Backend::Gloo => Device::Cpu,
            Backend::Nccl if tch::Cuda::device_count() == 0 => return Err(DistError::NoGpu),
            Backend::Nccl => Device::Cuda(env.local_rank),
        };
        let addr = format!("{}:{}", env.master_addr, env.master_port);
        let failed = |message: String| DistError::Rendezvous {
            rank: env.rank,
            world_size: env.world_size,
            addr: addr.clone(),
            message,
        };
        let host = CString::new(env.master_addr.as_str())
            .map_err(|_| failed("MASTER_ADDR contains a NUL byte".into()))?;
        let prefix = CString::new(format!("flowtune/{}", env.restart))
            .expect("no NUL in a formatted number");
        let (rank, size) = (to_i32(env.rank, &failed)?, to_i32(env.world_size, &failed)?);
        let device_index = match device {
            Device::Cuda(i) => i as i64,
            _ => -1,
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid C strings and an out pointer; the shim catches every C++ exception.
        let error = unsafe {
            ffi::ftd_group_new(
                host.as_ptr(),
                env.master_port,
                env.rank == 0 && !env.agent_store,
                prefix.as_ptr(),
                rank,
                size,
                backend as i32,
                device_index,
                timeout.as_millis().min(i64::MAX as u128) as i64,
                &mut raw,
            )
        };
        take_error(error).map_err(failed)?;
        Ok(ProcessGroup { raw, rank: env.rank, size: env.world_size, backend, device, timeout })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of processes in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The backend carrying the collectives.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Reduces `t` over all ranks in place (every rank gets the result). `t` must be contiguous.
    pub fn all_reduce_(&self, t: &mut Tensor, op: ReduceOp) -> Result<(), DistError> {
        const OP: &str = "all_reduce";
        contiguous(OP, "the tensor", t)?;
        // SAFETY: a live group and a live, contiguous tensor.
        self.outcome(OP, unsafe { ffi::ftd_all_reduce(self.raw, t.as_mut_ptr(), op as i32) })
    }

    /// Overwrites `t` on every rank with rank `root`'s `t`. `t` must be contiguous.
    pub fn broadcast_(&self, t: &mut Tensor, root: usize) -> Result<(), DistError> {
        const OP: &str = "broadcast";
        contiguous(OP, "the tensor", t)?;
        if root >= self.size {
            let message = format!("root rank {root} is not below the group size {}", self.size);
            return Err(DistError::BadTensor { op: OP, message });
        }
        // SAFETY: as in all_reduce_; root < size ≤ i32::MAX.
        self.outcome(OP, unsafe { ffi::ftd_broadcast(self.raw, t.as_mut_ptr(), root as i32) })
    }

    /// `out` = every rank's `shard` concatenated along dim 0, in rank order.
    pub fn all_gather_into(&self, out: &mut Tensor, shard: &Tensor) -> Result<(), DistError> {
        const OP: &str = "all_gather_into";
        self.check_pair(OP, ("out", out), ("shard", shard))?;
        let mut shard = shard.shallow_clone();
        // SAFETY: live tensors checked for layout, size, dtype and device.
        self.outcome(OP, unsafe {
            ffi::ftd_all_gather(self.raw, out.as_mut_ptr(), shard.as_mut_ptr())
        })
    }

    /// `out` = this rank's dim-0 block of `full`, reduced over all ranks.
    pub fn reduce_scatter_into(
        &self,
        out: &mut Tensor,
        full: &Tensor,
        op: ReduceOp,
    ) -> Result<(), DistError> {
        const OP: &str = "reduce_scatter_into";
        self.check_pair(OP, ("full", full), ("out", out))?;
        let mut full = full.shallow_clone();
        // SAFETY: as in all_gather_into.
        self.outcome(OP, unsafe {
            ffi::ftd_reduce_scatter(self.raw, out.as_mut_ptr(), full.as_mut_ptr(), op as i32)
        })
    }

    /// `out` block r (dim 0 cut into `size` equal blocks) = rank r's block `self.rank()` of
    /// `input`. Both contiguous, of the same shape, dtype and device; dim 0 divisible by the size.
    pub fn all_to_all_into(&self, out: &mut Tensor, input: &Tensor) -> Result<(), DistError> {
        const OP: &str = "all_to_all_into";
        contiguous(OP, "out", out)?;
        contiguous(OP, "input", input)?;
        let (size, n) = (input.size(), self.size as i64);
        if out.size() != size || out.kind() != input.kind() || out.device() != input.device() {
            let message = format!(
                "out is {:?} {:?} on {:?} but input is {size:?} {:?} on {:?}",
                out.size(),
                out.kind(),
                out.device(),
                input.kind(),
                input.device()
            );
            return Err(DistError::BadTensor { op: OP, message });
        }
        if size.first().is_none_or(|&d| d % n != 0) {
            let message = format!("input has shape {size:?}: dim 0 must split into {n} blocks");
            return Err(DistError::BadTensor { op: OP, message });
        }
        let mut input = input.shallow_clone();
        // SAFETY: live tensors checked for layout, shape, dtype and device.
        self.outcome(OP, unsafe {
            ffi::ftd_all_to_all(self.raw, out.as_mut_ptr(), input.as_mut_ptr())
        })
    }

    /// Ulysses' exchange, differentiable: `x` cut into `size` equal chunks along `scatter`, chunk
    /// r sent to rank r, the received chunks concatenated in rank order along `gather`. Its
    /// gradient is the exchange back. Every rank must call it (and run its backward) in step;
    /// the graph must not outlive this group. A failure in backward panics there.
    pub fn exchange(&self, x: &Tensor, scatter: i64, gather: i64) -> Result<Tensor, DistError> {
        const OP: &str = "exchange";
        let mut x = x.shallow_clone();
        let mut out = std::ptr::null_mut();
        // SAFETY: a live group and tensor; on success the shim hands us a new tensor.
        self.outcome(OP, unsafe {
            ffi::ftd_exchange(self.raw, x.as_mut_ptr(), scatter, gather, &mut out)
        })?;
        // SAFETY: a tensor the shim allocated for us.
        Ok(unsafe { Tensor::from_ptr(out) })
    }

    /// A group of `members` (ranks of this group, this rank among them, in the order that gives
    /// the new ranks), over this group's store under `tag`. Only the members call it, together;
    /// each set of members needs its own tag.
    pub fn sub_group(&self, tag: &str, members: &[usize]) -> Result<ProcessGroup, DistError> {
        let failed = |message: String| DistError::Collective { op: "sub_group", message };
        let Some(rank) = members.iter().position(|&m| m == self.rank) else {
            return Err(failed(format!("rank {} is not among {members:?}", self.rank)));
        };
        if let Some(&m) = members.iter().find(|&&m| m >= self.size) {
            return Err(failed(format!("member {m} is not below the group size {}", self.size)));
        }
        let list: Vec<String> = members.iter().map(usize::to_string).collect();
        let prefix = CString::new(format!("{tag}/{}", list.join(",")))
            .map_err(|_| failed("the tag contains a NUL byte".into()))?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: a live parent, a C string and an out pointer; ranks fit i32 as the parent's do.
        let error = unsafe {
            ffi::ftd_sub_group(
                self.raw,
                prefix.as_ptr(),
                rank as i32,
                members.len() as i32,
                &mut raw,
            )
        };
        take_error(error).map_err(failed)?;
        Ok(ProcessGroup { raw, rank, size: members.len(), ..*self })
    }

    /// Returns once every rank has called it.
    pub fn barrier(&self) -> Result<(), DistError> {
        // SAFETY: a live group.
        self.outcome("barrier", unsafe { ffi::ftd_barrier(self.raw) })
    }

    /// Every rank's bytes, in rank order (lengths may differ): all_gather of lengths, then of padded u8 tensors.
    pub fn all_gather_bytes(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, DistError> {
        let len = Tensor::from_slice(&[bytes.len() as i64]).to_device(self.device);
        let mut lens = Tensor::zeros([self.size as i64], (Kind::Int64, self.device));
        self.all_gather_into(&mut lens, &len)?;
        let lens = Vec::<i64>::try_from(&lens.to_device(Device::Cpu)).expect("an int64 vector");
        let width = lens.iter().copied().max().unwrap_or(0).max(1);
        let padded = Tensor::zeros([width], (Kind::Uint8, Device::Cpu));
        padded.narrow(0, 0, bytes.len() as i64).copy_(&Tensor::from_slice(bytes));
        let mut all = Tensor::zeros([width * self.size as i64], (Kind::Uint8, self.device));
        self.all_gather_into(&mut all, &padded.to_device(self.device))?;
        let all = Vec::<u8>::try_from(&all.to_device(Device::Cpu)).expect("a uint8 vector");
        Ok(lens
            .iter()
            .zip(all.chunks(width as usize))
            .map(|(&n, row)| row[..n as usize].to_vec())
            .collect())
    }

    /// `big` must be `small` stacked `size` times along dim 0: same dtype and device, contiguous.
    fn check_pair(
        &self,
        op: &'static str,
        big: (&str, &Tensor),
        small: (&str, &Tensor),
    ) -> Result<(), DistError> {
        let ((big_name, big), (small_name, small)) = (big, small);
        contiguous(op, big_name, big)?;
        contiguous(op, small_name, small)?;
        let bad = |message: String| Err(DistError::BadTensor { op, message });
        if big.kind() != small.kind() || big.device() != small.device() {
            let (bk, bd, sk, sd) = (big.kind(), big.device(), small.kind(), small.device());
            return bad(format!(
                "{big_name} is {bk:?} on {bd:?} but {small_name} is {sk:?} on {sd:?}"
            ));
        }
        let mut expected = small.size();
        if expected.is_empty() {
            return bad(format!("{small_name} is a scalar; it needs a dim 0 to concatenate along"));
        }
        expected[0] *= self.size as i64;
        if big.size() != expected {
            let found = big.size();
            return bad(format!(
                "{big_name} has shape {found:?}, expected {expected:?} ({} × {small_name})",
                self.size
            ));
        }
        Ok(())
    }

    fn outcome(&self, op: &'static str, error: *mut std::ffi::c_char) -> Result<(), DistError> {
        take_error(error).map_err(|message| {
            if message.to_ascii_lowercase().contains("timed out") {
                DistError::Timeout { op, after: self.timeout, message }
            } else {
                DistError::Collective { op, message }
            }
        })
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: the handle came from ftd_group_new and is freed once.
        unsafe { ffi::ftd_group_free(self.raw) }
    }
}

fn contiguous(op: &'static str, name: &str, t: &Tensor) -> Result<(), DistError> {
    if t.is_contiguous() {
        return Ok(());
    }
    let message = format!("{name} is not contiguous (call .contiguous() first)");
    Err(DistError::BadTensor { op, message })
}

fn to_i32(n: usize, failed: &impl Fn(String) -> DistError) -> Result<i32, DistError> {
    i32::try_from(n).map_err(|_| failed(format!("{n} does not fit c10d's 32-bit ranks")))
}
