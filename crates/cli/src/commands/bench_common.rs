//! Helpers shared by the `bench` subcommands (and other commands' `--dtype` flags).

use std::time::Instant;

use flowtune_models::Dtype;
use tch::Device;

use crate::Failure;

/// A `--dtype` value: f32, bf16 or f16.
pub(crate) fn parse_dtype(text: &str) -> Result<Dtype, String> {
    serde_json::from_value(serde_json::Value::String(text.into()))
        .map_err(|_| format!("{text}: expected f32, bf16 or f16"))
}

/// Seconds per call of `f` over `iters` calls after one warm-up call.
pub(crate) fn time(
    iters: usize,
    device: Device,
    mut f: impl FnMut() -> Result<(), Failure>,
) -> Result<f64, Failure> {
    f()?;
    let sync = || {
        if let Device::Cuda(i) = device {
            tch::Cuda::synchronize(i as i64);
        }
    };
    sync();
    let start = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    sync();
    Ok(start.elapsed().as_secs_f64() / iters as f64)
}
