//! Memory figures of a step: the process's peak resident memory (what a CPU run holds at most)
//! and, on a GPU, the caching allocator's peaks over the step.

use flowtune_objectives::Metrics;
use tch::Device;

/// Starts a step's GPU peaks over.
pub(crate) fn start_step(device: Device) {
    if let Device::Cuda(i) = device {
        flowtune_cuda::reset_peaks(i);
    }
}

/// `perf/max_memory_rss_gb`, and on a GPU `perf/max_memory_allocated_gb` and
/// `perf/max_memory_reserved_gb` since [`start_step`].
pub(crate) fn step_metrics(device: Device, m: &mut Metrics) {
    if let Some(gb) = peak_rss_gb() {
        m.insert("perf/max_memory_rss_gb".into(), gb);
    }
    let peaks = match device {
        Device::Cuda(i) => flowtune_cuda::memory_peaks(i),
        _ => None,
    };
    if let Some(p) = peaks {
        let gb = |bytes: u64| bytes as f64 / (1u64 << 30) as f64;
        m.insert("perf/max_memory_allocated_gb".into(), gb(p.allocated_bytes));
        m.insert("perf/max_memory_reserved_gb".into(), gb(p.reserved_bytes));
    }
}

/// The peak resident set size of this process in GiB (Linux `VmHWM`), if the system says.
pub(crate) fn peak_rss_gb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_peak_covers_what_the_process_holds() {
        let held = vec![1u8; 64 << 20];
        let peak = super::peak_rss_gb().expect("Linux reports VmHWM");
        assert!(peak >= 64.0 / 1024.0, "{peak} GiB with 64 MiB held");
        assert_eq!(held[12345], 1);
    }
}
