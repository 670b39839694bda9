//! `flowtune list`: what the registries hold.

use flowtune_objectives::algorithms;
use flowtune_sampling::{Pipeline, SdeType};

use crate::Failure;

/// Prints every registered algorithm, SDE type, sigma-grid schedule, reward and model family.
pub fn run() -> Result<(), Failure> {
    println!("algorithms:");
    for a in algorithms() {
        println!("  {:<14} {}", a.name, a.summary);
    }
    println!("sde types: {}", SdeType::NAMES.join(", "));
    println!("sigma-grid schedules: {}", Pipeline::NAMES.join(", "));
    println!("rewards: {}", flowtune_rewards::REWARD_NAMES.join(", "));
    println!("model families:");
    for f in flowtune_models::families() {
        println!(
            "  {:<14} {} (denoiser {})",
            f.name,
            f.pipeline_classes.join(", "),
            f.denoiser_class
        );
        for (folder, holds) in f.components {
            println!("    {folder:<36} {holds}");
        }
    }
    Ok(())
}
