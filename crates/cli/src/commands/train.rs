//! `flowtune train RECIPE [KEY=VALUE…]`.

use std::path::PathBuf;

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

pub fn run(args: TrainArgs, device: &DeviceArg) -> Result<(), Failure> {
    let recipe = Recipe::load(&args.recipe, &args.overrides).map_err(Failure::input)?;
    let device = device.resolve()?;
    let summary = train(&recipe, device).map_err(Failure::training)?;
    if summary.rank != 0 {
        return Ok(());
    }
    println!(
        "trained {} steps; weights written to {}",
        summary.steps_run,
        summary.export.display()
    );
    Ok(())
}
