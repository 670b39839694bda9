//! `flowtune config show RECIPE [KEY=VALUE…]` and `flowtune config keys [--out FILE]`.

use std::path::PathBuf;

use anyhow::Context;
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
    /// Print the reference of every recipe key (Markdown: type, default, description).
    Keys {
        /// Write it to this file instead (the repository's is docs/reference/recipe-keys.md).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

pub fn run(command: ConfigCommand) -> Result<(), Failure> {
    match command {
        ConfigCommand::Show { recipe, overrides } => {
            let recipe = Recipe::load(&recipe, &overrides).map_err(Failure::input)?;
            print!("{}", recipe.to_yaml());
            Ok(())
        }
        ConfigCommand::Keys { out: None } => {
            print!("{}", flowtune_config::recipe_keys());
            Ok(())
        }
        ConfigCommand::Keys { out: Some(out) } => {
            std::fs::write(&out, flowtune_config::recipe_keys())
                .with_context(|| format!("cannot write {}", out.display()))
                .map_err(Failure::input)
        }
    }
}
