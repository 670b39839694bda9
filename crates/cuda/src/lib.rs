//! What the CUDA devices are and how much memory PyTorch's caching allocator holds, as
//! `torch.cuda.get_device_properties`, `max_memory_allocated` and `max_memory_reserved` report
//! them. Without a GPU (or a build without the CUDA headers) every query answers `None`.

use std::ffi::{c_char, c_int, CStr};

extern "C" {
    fn ftc_compiled_with_cuda() -> c_int;
    fn ftc_device_properties(
        device: c_int,
        name: *mut c_char,
        len: c_int,
        total: *mut u64,
        major: *mut c_int,
        minor: *mut c_int,
    ) -> c_int;
    fn ftc_memory_peaks(device: c_int, allocated: *mut u64, reserved: *mut u64) -> c_int;
    fn ftc_reset_peaks(device: c_int) -> c_int;
    fn ftc_mem_get_info(device: c_int, free: *mut u64, total: *mut u64) -> c_int;
}

/// One CUDA device.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    pub name: String,
    pub total_memory_bytes: u64,
    /// Compute capability (major, minor).
    pub capability: (i32, i32),
}

impl DeviceInfo {
    /// Whether the device computes in bf16 natively (compute capability 8.0, Ampere, or newer).
    pub fn supports_bf16(&self) -> bool {
        self.capability.0 >= 8
    }
}

/// Peak memory since the last [`reset_peaks`], in bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryPeaks {
    /// Held by tensors (`torch.cuda.max_memory_allocated`).
    pub allocated_bytes: u64,
    /// Held by the caching allocator (`torch.cuda.max_memory_reserved`).
    pub reserved_bytes: u64,
}

/// Whether this build can read CUDA devices at all.
pub fn compiled_with_cuda() -> bool {
    // SAFETY: no arguments.
    unsafe { ftc_compiled_with_cuda() != 0 }
}

/// Whether `device` is a CUDA device torch sees.
fn visible(device: usize) -> bool {
    compiled_with_cuda() && device < tch::Cuda::device_count() as usize
}

/// The name, memory and compute capability of CUDA device `device`.
pub fn device_info(device: usize) -> Option<DeviceInfo> {
    if !visible(device) {
        return None;
    }
    let mut name = [0 as c_char; 256];
    let (mut total, mut major, mut minor) = (0u64, 0, 0);
    // SAFETY: a 256-byte buffer and three out values.
    let failed = unsafe {
        ftc_device_properties(
            device as c_int,
            name.as_mut_ptr(),
            256,
            &mut total,
            &mut major,
            &mut minor,
        )
    };
    if failed != 0 {
        return None;
    }
    // SAFETY: the shim NUL-terminates the name within the buffer.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
    Some(DeviceInfo { name, total_memory_bytes: total, capability: (major, minor) })
}

/// The allocator's peak memory on CUDA device `device` since the last [`reset_peaks`].
pub fn memory_peaks(device: usize) -> Option<MemoryPeaks> {
    if !visible(device) {
        return None;
    }
    let (mut allocated, mut reserved) = (0u64, 0u64);
    // SAFETY: two out values.
    let failed = unsafe { ftc_memory_peaks(device as c_int, &mut allocated, &mut reserved) };
    (failed == 0).then_some(MemoryPeaks { allocated_bytes: allocated, reserved_bytes: reserved })
}

/// Bytes free on CUDA device `device` now, as the driver counts them (`torch.cuda.mem_get_info`):
/// other processes' memory and this one's CUDA context are not free.
pub fn free_memory(device: usize) -> Option<u64> {
    if !visible(device) {
        return None;
    }
    let (mut free, mut total) = (0u64, 0u64);
    // SAFETY: two out values.
    let failed = unsafe { ftc_mem_get_info(device as c_int, &mut free, &mut total) };
    (failed == 0).then_some(free)
}

/// Starts the peaks of `device` over from what is held now (once per training step).
pub fn reset_peaks(device: usize) {
    if visible(device) {
        // SAFETY: a device index torch sees.
        unsafe { ftc_reset_peaks(device as c_int) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_answer_as_torch_sees_them() {
        let count = tch::Cuda::device_count() as usize;
        assert_eq!(device_info(count), None, "past the last device");
        assert_eq!(memory_peaks(count), None);
        assert_eq!(free_memory(count), None);
        if count == 0 {
            assert_eq!(device_info(0), None, "no GPU here");
            return;
        }
        let info = device_info(0).expect("a visible GPU has properties");
        assert!(!info.name.is_empty() && info.total_memory_bytes > 1 << 30, "{info:?}");
        let free = free_memory(0).expect("the driver's free memory");
        assert!(free > 0 && free <= info.total_memory_bytes, "{free} of {info:?}");
        reset_peaks(0);
        let held = tch::Tensor::zeros([64 << 20], (tch::Kind::Uint8, tch::Device::Cuda(0)));
        let peaks = memory_peaks(0).expect("allocator statistics");
        assert!(peaks.allocated_bytes >= 64 << 20 && peaks.reserved_bytes >= peaks.allocated_bytes);
        drop(held);
    }
}
