//! `flowtune config show RECIPE [KEY=VALUE…]`.

use std::path::PathBuf;

use clap::Subcommand;
use flowtune_config::Recipe;

use crate::Failure;

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Print the recipe with defaults filled in and overrides applied.
    Show {
        /// A YAML recipe.
        recipe: PathBuf,
        /// Overrides like `rollout.noise_level=0.9`.
        overrides: Vec<String>,
    },
}

pub fn run(command: ConfigCommand) -> Result<(), Failure> {
    match command {
        ConfigCommand::Show { recipe, overrides } => {
            let recipe = Recipe::load(&recipe, &overrides).map_err(Failure::input)?;
            print!("{}", recipe.to_yaml());
            Ok(())
        }
    }
}
