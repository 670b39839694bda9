//! Text encoders of the diffusers pipelines, in the transformers layout.

pub mod clip;
pub mod gemma3;
pub mod mistral3;
pub(crate) mod mistral3_tiny;
pub mod qwen2_5_vl;
pub mod qwen2_5_vl_positions;
pub mod qwen2_5_vl_vision;
pub mod qwen2_vl_processor;
pub mod qwen2_vl_vision;
pub mod qwen3;
pub mod qwen3_vl;
pub mod qwen3_vl_vision;
pub mod qwen_decoder;
pub mod qwen_edit_prompts;
pub mod qwen_prompts;
pub mod qwen_tiny;
pub mod t5;

use std::path::Path;

use tch::nn::VarStore;
use tch::Kind;

pub(crate) use crate::weights::store;
use crate::weights::{checkpoint_files, load_weights, LoadOptions};
use crate::ModelError;

/// Loads the weights of a component directory into `store` as `kind`, frozen (text encoders are
/// not trained); checkpoint names under `ignored` are skipped, `renamed` maps other key layouts.
fn load_frozen(
    store: &mut VarStore,
    dir: &Path,
    kind: Kind,
    ignored: &'static [&'static str],
    renamed: &'static [(&'static str, &'static str)],
) -> Result<(), ModelError> {
    let options = LoadOptions {
        kind: Some(kind),
        ignored_prefixes: ignored,
        renamed_prefixes: renamed,
        ..Default::default()
    };
    load_weights(store, &checkpoint_files(dir)?, options)?;
    store.freeze();
    Ok(())
}
