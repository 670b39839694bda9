//! Recipes: YAML files with Hydra-style `a.b.c=value` command-line overrides, resolved into typed
//! settings with defaults and validated before anything runs. Every error is one line naming the
//! file or override, the key, the value and what is allowed.

mod auto_sizes;
mod needs;
mod overrides;
mod paths;
mod recipe;
mod reference;
mod renamed;
mod resolved;
mod sections;
mod suggest;

pub use auto_sizes::AutoSizes;
pub use overrides::Override;
pub use recipe::Recipe;
pub use reference::recipe_keys;
pub use renamed::RENAMED;
pub use resolved::RESOLVED;
pub use sections::{
    DataSection, Finetune, LrSchedule, ModelSection, Offload, OldLogProb, Resume, Sharding,
    StateOffload, TeacherSection, TrainerSection,
};

/// Why a recipe could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read recipe {path}: {message}")]
    Read { path: String, message: String },
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    #[error("override `{text}`: {message}")]
    Override { text: String, message: String },
    #[error("{file}: {key}: {message}")]
    Invalid { file: String, key: String, message: String },
}
