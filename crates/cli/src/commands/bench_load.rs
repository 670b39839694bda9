//! `flowtune bench load`: what loading a transformer directory costs in memory. One JSON line:
//! the loaded weights' bytes, the checkpoint files' bytes (and the largest file's), the process's
//! resident memory just before loading and at its peak (Linux `VmRSS` / `VmHWM`, so the peak
//! includes the mapped file pages still resident), and on a GPU the allocator's peak.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use flowtune_models::weights::checkpoint_files;
use flowtune_models::Dtype;
use flowtune_trainer::status_bytes;
use tch::Device;

use super::bench_common::parse_dtype;
use crate::Failure;

#[derive(Args)]
pub struct LoadArgs {
    /// A transformer directory (config.json + safetensors).
    #[arg(long)]
    component: PathBuf,
    /// f32 | bf16 | f16
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    dtype: Dtype,
}

pub fn run(a: LoadArgs, device: Device) -> Result<(), Failure> {
    let family = flowtune_models::denoiser_family(&a.component).map_err(Failure::input)?;
    let files = checkpoint_files(&a.component).map_err(Failure::input)?;
    let sizes: Vec<u64> =
        files.iter().map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0)).collect();
    if let Device::Cuda(i) = device {
        flowtune_cuda::reset_peaks(i);
    }
    let before = status_bytes("VmRSS:");
    let start = Instant::now();
    let model = (family.load_denoiser)(&a.component, device, a.dtype.kind(), None)
        .map_err(Failure::input)?;
    let seconds = start.elapsed().as_secs_f64();
    let peak = status_bytes("VmHWM:");
    let weights: u64 = model
        .store()
        .variables()
        .values()
        .map(|t| t.numel() as u64 * t.kind().elt_size_in_bytes() as u64)
        .sum();
    let allocated = match device {
        Device::Cuda(i) => flowtune_cuda::memory_peaks(i).map(|p| p.allocated_bytes),
        _ => None,
    };
    let line = serde_json::json!({
        "component": a.component.display().to_string(),
        "model": model.describe(),
        "device": format!("{device:?}"),
        "weights_bytes": weights,
        "checkpoint_bytes": sizes.iter().sum::<u64>(),
        "largest_file_bytes": sizes.iter().max(),
        "rss_before_bytes": before,
        "rss_peak_bytes": peak,
        "peak_over_weights": peak.zip(before).map(|(p, b)| (p.saturating_sub(b)) as f64 / weights as f64),
        "gpu_peak_allocated_bytes": allocated,
        "seconds": seconds,
    });
    println!("{line}");
    Ok(())
}
