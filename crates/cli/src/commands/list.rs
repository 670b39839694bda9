//! `flowtune list`: what the registries hold.

use flowtune_objectives::ALGORITHMS;
use flowtune_sampling::{Pipeline, SdeType};

use crate::Failure;

/// Prints every registered algorithm, SDE type and pipeline.
pub fn run() -> Result<(), Failure> {
    println!("algorithms:");
    for a in ALGORITHMS {
        println!("  {:<14} {}", a.name, a.summary);
    }
    println!("sde types: {}", SdeType::NAMES.join(", "));
    println!("pipelines: {}", Pipeline::NAMES.join(", "));
    println!("rewards: {}", flowtune_rewards::REWARD_NAMES.join(", "));
    let classes: Vec<&str> =
        flowtune_models::pipeline::PIPELINES.iter().map(|p| p.class_name).collect();
    println!("model families: {}", classes.join(", "));
    Ok(())
}
