//! Performance figures of a step: the model work it did (`perf/tflops`, `perf/mfu`, counted by
//! [`flowtune_models::flops`]), the process's peak resident memory (what a CPU run holds at most)
//! and, on a GPU, the caching allocator's peaks over the step.

use std::time::Instant;

use flowtune_objectives::Metrics;
use tch::{Device, Kind};

/// The actor update of a step: its time and model work.
pub(crate) struct ActorUpdate {
    start: Instant,
    flops: f64,
}

impl ActorUpdate {
    pub fn start() -> Self {
        Self { start: Instant::now(), flops: flowtune_models::flops::counted() }
    }

    /// `timing_s/update_actor` and `perf/tflops/actor` (the update's model TFLOP/s).
    pub fn finish(self, m: &mut Metrics) {
        let seconds = self.start.elapsed().as_secs_f64();
        let work = flowtune_models::flops::counted() - self.flops;
        m.insert("timing_s/update_actor".into(), seconds);
        m.insert("perf/tflops/actor".into(), work / seconds / 1e12);
    }
}

/// Where a step's figures start from.
pub(crate) struct StepPerf {
    device: Device,
    flops: f64,
}

/// Starts a step's GPU peaks and work count over.
pub(crate) fn start_step(device: Device) -> StepPerf {
    if let Device::Cuda(i) = device {
        flowtune_cuda::reset_peaks(i);
    }
    StepPerf { device, flops: flowtune_models::flops::counted() }
}

/// Dense matmul peak in TFLOP/s of a GPU by name, for the model's dtype (tensor cores for bf16 and
/// f16, plain FP32 otherwise), from the vendors' data sheets (SXM parts unless named).
pub(crate) fn known_peak_tflops(gpu: &str, kind: Kind) -> Option<f64> {
    const PEAKS: [(&str, f64, f64); 7] = [
        ("H100 PCIe", 756.0, 51.0),
        ("H100 NVL", 835.0, 60.0),
        ("H100", 989.4, 66.9),
        ("H200", 989.4, 66.9),
        ("B200", 2250.0, 80.0),
        ("A100", 312.0, 19.5),
        ("L40S", 362.1, 91.6),
    ];
    let (_, half, single) = PEAKS.iter().find(|(name, _, _)| gpu.contains(name))?;
    Some(if matches!(kind, Kind::BFloat16 | Kind::Half) { *half } else { *single })
}

/// `perf/tflops` (model TFLOP/s of this rank over the step); `perf/mfu`, `perf/mfu/actor` and
/// `perf/mfu/rollout` (the step's, the actor update's and the rollout's TFLOP/s over `peak_tflops`, or the GPU's known peak for
/// `kind`); `perf/max_memory_rss_gb` and `perf/memory_rss_gb` (resident at the step's end),
/// and on a GPU `perf/max_memory_allocated_gb` and
/// `perf/max_memory_reserved_gb` since [`start_step`].
pub(crate) fn step_metrics(
    start: &StepPerf,
    seconds: f64,
    peak_tflops: Option<f64>,
    kind: Kind,
    m: &mut Metrics,
) {
    let tflops = (flowtune_models::flops::counted() - start.flops) / seconds / 1e12;
    m.insert("perf/tflops".into(), tflops);
    let peak = peak_tflops.or_else(|| match start.device {
        Device::Cuda(i) => known_peak_tflops(&flowtune_cuda::device_info(i)?.name, kind),
        _ => None,
    });
    if let Some(peak) = peak {
        m.insert("perf/mfu".into(), tflops / peak);
        for phase in ["actor", "rollout"] {
            if let Some(tflops) = m.get(&format!("perf/tflops/{phase}")).copied() {
                m.insert(format!("perf/mfu/{phase}"), tflops / peak);
            }
        }
    }
    if let Some(gb) = peak_rss_gb() {
        m.insert("perf/max_memory_rss_gb".into(), gb);
    }
    if let Some(bytes) = status_bytes("VmRSS:") {
        m.insert("perf/memory_rss_gb".into(), bytes as f64 / (1u64 << 30) as f64);
    }
    let peaks = match start.device {
        Device::Cuda(i) => flowtune_cuda::memory_peaks(i),
        _ => None,
    };
    if let Some(p) = peaks {
        let gb = |bytes: u64| bytes as f64 / (1u64 << 30) as f64;
        m.insert("perf/max_memory_allocated_gb".into(), gb(p.allocated_bytes));
        m.insert("perf/max_memory_reserved_gb".into(), gb(p.reserved_bytes));
    }
}

/// What loading took, in one line: its seconds and the peaks so far, resident in host memory
/// (in all, and the rise over `rss_before` bytes) and allocated on a GPU (`key=value` parsable).
pub(crate) fn load_line(device: Device, seconds: f64, rss_before: Option<u64>) -> String {
    let gib = |bytes: u64| bytes as f64 / (1u64 << 30) as f64;
    let mut line = format!("loaded the pipeline in {seconds:.1} s");
    if let Some(peak) = status_bytes("VmHWM:") {
        line.push_str(&format!(", load_peak_rss_gb={:.3}", gib(peak)));
        if let Some(before) = rss_before {
            line.push_str(&format!(", load_rss_rise_gb={:.3}", gib(peak.saturating_sub(before))));
        }
    }
    if let Some(p) = match device {
        Device::Cuda(i) => flowtune_cuda::memory_peaks(i),
        _ => None,
    } {
        line.push_str(&format!(", load_peak_allocated_gb={:.3}", gib(p.allocated_bytes)));
    }
    line
}

/// The peak resident set size of this process in GiB (Linux `VmHWM`), if the system says.
pub(crate) fn peak_rss_gb() -> Option<f64> {
    Some(status_bytes("VmHWM:")? as f64 / (1u64 << 30) as f64)
}

/// A `/proc/self/status` memory field of this process in bytes (`VmRSS:` now, `VmHWM:` at its
/// peak), where Linux reports it.
pub fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

#[cfg(test)]
mod tests {
    use tch::Kind;

    #[test]
    fn known_gpus_have_their_dtype_peaks() {
        let peak = super::known_peak_tflops;
        assert_eq!(peak("NVIDIA H100 80GB HBM3", Kind::BFloat16), Some(989.4));
        assert_eq!(peak("NVIDIA H100 PCIe", Kind::BFloat16), Some(756.0));
        assert_eq!(peak("NVIDIA H200", Kind::Float), Some(66.9));
        assert_eq!(peak("NVIDIA A100-SXM4-80GB", Kind::Half), Some(312.0));
        assert_eq!(peak("Some GPU", Kind::BFloat16), None);
    }

    #[test]
    fn the_peak_covers_what_the_process_holds() {
        let held = vec![1u8; 64 << 20];
        let peak = super::peak_rss_gb().expect("Linux reports VmHWM");
        assert!(peak >= 64.0 / 1024.0, "{peak} GiB with 64 MiB held");
        assert_eq!(held[12345], 1);
    }
}
