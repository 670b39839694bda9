//! `flowtune train RECIPE [KEY=VALUE…]`.

use std::path::PathBuf;

use anyhow::anyhow;
use clap::Args;
use flowtune_config::Recipe;
use flowtune_trainer::train;

use crate::device::DeviceArg;
use crate::Failure;

#[derive(Args)]
pub struct TrainArgs {
    /// A YAML recipe.
    recipe: PathBuf,
    /// Overrides like `trainer.total_steps=20`.
    overrides: Vec<String>,
}

pub fn run(args: TrainArgs, named: Option<DeviceArg>) -> Result<(), Failure> {
    let mut recipe = Recipe::load(&args.recipe, &args.overrides).map_err(Failure::input)?;
    let device = device(named, recipe.trainer.device.as_deref())?;
    let gpus = std::env::var("WORLD_SIZE").ok().and_then(|w| w.parse().ok()).unwrap_or(1);
    super::auto_sizes::fit_to_device(&mut recipe, device, gpus)?;
    if let (tch::Device::Cuda(i), true) = (device, recipe.trainer.memory_check) {
        // What is free now (other processes' memory is not), else the device's total.
        let bytes = flowtune_cuda::free_memory(i)
            .map(|free| (free, "free"))
            .or_else(|| flowtune_cuda::device_info(i).map(|d| (d.total_memory_bytes, "in all")));
        if let Some((bytes, what)) = bytes {
            super::plan::check_fits(&recipe, gpus, bytes as f64 / flowtune_plan::GIB, what)?;
        }
    }
    let summary = train(&recipe, device).map_err(Failure::training)?;
    if let Some(why) = summary.stopped {
        return Err(Failure::Runtime(anyhow!(why)));
    }
    if summary.rank != Some(0) {
        return Ok(());
    }
    println!(
        "trained {} steps; weights written to {}",
        summary.steps_run,
        summary.export.display()
    );
    Ok(())
}

/// `--device`, else `trainer.device`, else a GPU when torch sees one (said once per job), else the
/// CPU.
fn device(named: Option<DeviceArg>, in_recipe: Option<&str>) -> Result<tch::Device, Failure> {
    if let Some(d) = named {
        return d.resolve();
    }
    if let Some(text) = in_recipe {
        let parsed = crate::device::parse(text).map_err(|e| Failure::input(anyhow!(e)))?;
        return parsed.resolve_as("trainer.device");
    }
    let gpus = tch::Cuda::device_count();
    if gpus == 0 {
        return Ok(tch::Device::Cpu);
    }
    if std::env::var("RANK").map_or(true, |r| r == "0") {
        eprintln!(
            "device: cuda (torch sees {gpus} CUDA device(s); --device or trainer.device names one, \
             cpu included)"
        );
    }
    Ok(tch::Device::Cuda(0))
}
