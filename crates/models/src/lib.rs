//! Diffusion model families in the diffusers layout. Each module tree mirrors its checkpoint keys
//! (`transformer_blocks.3.attn.to_q`), configs mirror `config.json`, and LoRA adapters attach by
//! the same dotted names users give PEFT.

pub mod lora;
pub mod nn;
pub mod pipeline;
pub mod sd3;
pub mod text_encoders;
pub mod tokenizer;
pub mod vae;
pub mod weights;

pub use lora::{AdapterSwitch, LoraConfig};
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
    #[error(transparent)]
    Torch(#[from] tch::TchError),
    #[error(transparent)]
    Sampling(#[from] flowtune_sampling::SamplingError),
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

/// Text conditioning of a denoiser: token states and, for models that use one, a pooled vector.
pub struct TextConditioning {
    /// (B, L, D) token states.
    pub embeds: tch::Tensor,
    /// (B, P) pooled text, where the model takes one (SD3, Flux).
    pub pooled: Option<tch::Tensor>,
}

impl TextConditioning {
    /// Rows `[self; other]` stacked, for one batched CFG forward.
    pub fn concat(&self, other: &Self) -> Self {
        Self {
            embeds: tch::Tensor::cat(&[&self.embeds, &other.embeds], 0),
            pooled: self
                .pooled
                .as_ref()
                .zip(other.pooled.as_ref())
                .map(|(a, b)| tch::Tensor::cat(&[a, b], 0)),
        }
    }

    /// The rows at `index` (a 1-D int64 tensor).
    pub fn rows(&self, index: &tch::Tensor) -> Self {
        Self {
            embeds: self.embeds.index_select(0, index),
            pooled: self.pooled.as_ref().map(|p| p.index_select(0, index)),
        }
    }
}

/// A flow-matching denoiser: velocity of latents at timesteps (0‥1000) given text.
pub trait Denoiser {
    fn velocity(
        &self,
        latents: &tch::Tensor,
        timestep: &tch::Tensor,
        text: &TextConditioning,
    ) -> Result<tch::Tensor, ModelError>;
}

impl Denoiser for sd3::Sd3Transformer {
    fn velocity(
        &self,
        latents: &tch::Tensor,
        timestep: &tch::Tensor,
        text: &TextConditioning,
    ) -> Result<tch::Tensor, ModelError> {
        let pooled = text
            .pooled
            .as_ref()
            .ok_or_else(|| ModelError::Input("SD3 needs pooled text embeddings".into()))?;
        self.forward(latents, &text.embeds, pooled, timestep)
    }
}

/// Writes a JSON file (pretty, trailing newline), naming the file on failure.
pub fn write_json(path: &std::path::Path, value: &impl serde::Serialize) -> Result<(), ModelError> {
    let text = serde_json::to_string_pretty(value).expect("JSON-serialisable config") + "\n";
    std::fs::write(path, text)
        .map_err(|e| ModelError::Io { path: path.display().to_string(), message: e.to_string() })
}
