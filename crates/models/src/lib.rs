//! Diffusion model families in the diffusers layout. Each module tree mirrors its checkpoint keys
//! (`transformer_blocks.3.attn.to_q`), configs mirror `config.json`, and LoRA adapters attach by
//! the same dotted names users give PEFT.

pub mod audio;
mod causal_vae;
pub mod clip;
pub mod condition_sizes;
mod conditioning;
pub mod denoiser;
pub mod family;
pub mod flops;
pub mod flux;
pub mod flux2;
pub mod hub;
pub mod lora;
pub mod ltx2;
pub mod model_weights;
pub mod nn;
pub mod packing;
pub mod pictures;
pub mod pipeline;
pub mod prompt_clean;
pub mod qwen_image;
pub mod qwen_image21;
pub mod random;
pub mod registry;
pub mod resize;
pub mod sd3;
pub mod sequence;
pub mod shard;
pub mod shard_load;
pub mod streamed;
mod switch;
pub mod text_encoders;
pub mod tokenizer;
pub mod vae;
pub mod vlm;
pub mod wan;
pub mod weights;
pub mod z_image;

pub use audio::Waveform;
pub use condition_sizes::{condition_sizes, ConditionSizes};
pub use conditioning::{generated_frames, hold_frames, TextConditioning, Unpadding, HELD_LATENTS};
pub use denoiser::{
    guided_velocity, rescaled_guidance, unpadded_velocity, velocity_at_sigma, CfgScale, Denoiser,
    ExampleInputs, ExampleShape, TrainableDenoiser,
};
pub use family::{Dtype, Dtypes, FlowPipeline, Offload, PipelineOptions};
pub use lora::{AdapterSwitch, LoraConfig};
pub use model_weights::{ModelWeights, WeightsBuilder};
pub use random::{with_random_weights, RandomWeights, StandInText};
pub use registry::{
    denoiser_family, families, family_named, family_of, load_denoiser, load_pipeline, Family,
};
pub use weights::{load_weights, LoadOptions};

/// Errors of model loading and running: they name the file, the tensor and what was expected.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read {path}: {message}")]
    Io { path: String, message: String },
    #[error("{path}: {message}")]
    Format { path: String, message: String },
    #[error("{path}: missing tensor(s) {names}")]
    Missing { path: String, names: String },
    #[error("{path}: unexpected tensor(s) {names} (not part of the model this config describes)")]
    Unexpected { path: String, names: String },
    #[error("{path}: tensor {name} has shape {found:?}, the config expects {expected:?}")]
    Shape { path: String, name: String, expected: Vec<i64>, found: Vec<i64> },
    #[error("{0}")]
    Input(String),
    /// A collective of sharded weights failed: another rank stopped, hung or cannot be reached.
    #[error("distributed: {0} (a rank of this job stopped, hung or cannot be reached; the newest complete checkpoint stays loadable: rerun with trainer.resume: auto)")]
    Collective(String),
    #[error(transparent)]
    Torch(#[from] tch::TchError),
    #[error(transparent)]
    Sampling(#[from] flowtune_sampling::SamplingError),
}

impl ModelError {
    /// Whether the failure came from the running computation (libtorch, or a collective with
    /// the other ranks) rather than from the files, settings or inputs it was given.
    pub fn is_runtime(&self) -> bool {
        matches!(self, Self::Torch(_) | Self::Collective(_))
    }
}

/// Reads a JSON config file into its typed mirror, naming the file on failure.
pub fn read_config<T: serde::de::DeserializeOwned>(
    path: &std::path::Path,
) -> Result<T, ModelError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ModelError::Io { path: path.display().to_string(), message: e.to_string() })?;
    serde_json::from_str(&text).map_err(|e| ModelError::Format {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// Writes a JSON file (pretty, trailing newline), naming the file on failure.
pub fn write_json(path: &std::path::Path, value: &impl serde::Serialize) -> Result<(), ModelError> {
    let text = serde_json::to_string_pretty(value).expect("JSON-serialisable config") + "\n";
    std::fs::write(path, text)
        .map_err(|e| ModelError::Io { path: path.display().to_string(), message: e.to_string() })
}
