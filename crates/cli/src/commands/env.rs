//! `flowtune env`: what torch build and devices this binary runs with.

use anyhow::Context;
use tch::{Kind, Tensor};

use crate::device::{self, DeviceArg};
use crate::Failure;

/// Prints the torch version, CUDA availability, each GPU (name, memory, compute capability, bf16
/// support) and threads, then runs a small
/// matmul on the selected device to prove it works.
pub fn run(arg: &DeviceArg) -> Result<(), Failure> {
    println!("flowtune {}", env!("CARGO_PKG_VERSION"));
    println!(
        "torch: {} (libtorch from {})",
        env!("FLOWTUNE_TORCH_VERSION"),
        env!("FLOWTUNE_TORCH_LIB")
    );
    println!("cuda available: {}", tch::Cuda::is_available());
    println!("cuda devices: {}", tch::Cuda::device_count());
    for i in 0..tch::Cuda::device_count().max(0) as usize {
        if let Some(d) = flowtune_cuda::device_info(i) {
            let (major, minor) = d.capability;
            println!(
                "  cuda:{i}: {}, {:.1} GiB, compute capability {major}.{minor}, bf16 {}",
                d.name,
                d.total_memory_bytes as f64 / (1u64 << 30) as f64,
                if d.supports_bf16() { "yes" } else { "no" }
            );
        }
    }
    println!("cudnn available: {}", tch::Cuda::cudnn_is_available());
    let threads = tch::get_num_threads();
    match flowtune_trainer::threads::fixed() {
        true => println!("threads: {threads}"),
        false => println!(
            "threads: {threads} (a CPU run takes one per {:.0e} multiply-adds of a denoiser \
             forward, up to these, and says so; --threads fixes them)",
            flowtune_trainer::threads::WORK_PER_THREAD
        ),
    }
    let wait = |v: &str| std::env::var(v).unwrap_or_else(|_| "unset".into());
    println!(
        "openmp wait: OMP_WAIT_POLICY={} GOMP_SPINCOUNT={}",
        wait("OMP_WAIT_POLICY"),
        wait("GOMP_SPINCOUNT")
    );
    let device = arg.resolve()?;
    let a = Tensor::f_ones([64, 64], (Kind::Float, device))
        .context("allocating on the device")
        .map_err(Failure::Runtime)?;
    let sum =
        a.f_matmul(&a).and_then(|p| p.f_sum(Kind::Double)).and_then(|s| s.f_double_value(&[]));
    match sum {
        Ok(s) if s == 64.0 * 64.0 * 64.0 => {
            println!("device: {} (matmul check passed)", device::name(device))
        }
        Ok(s) => {
            return Err(Failure::Runtime(anyhow::anyhow!(
                "matmul check on {} gave {s}",
                device::name(device)
            )))
        }
        Err(e) => {
            return Err(Failure::Runtime(
                anyhow::Error::new(e).context(format!("matmul on {}", device::name(device))),
            ))
        }
    }
    Ok(())
}
