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
    Ok(())
}
