//! Qwen-Image (MMDiT with dual-stream blocks, a Qwen2.5-VL text encoder and a causal 3-D VAE) in
//! the diffusers layout.

mod block;
mod config;
mod edit;
mod family;
mod pipeline;
pub(crate) mod rope;
mod tiny;
mod transformer;
mod vae;

pub use config::QwenImageTransformerConfig;
pub use edit::{calculate_dimensions, condition_sizes};
pub use family::FAMILY;
pub use pipeline::{QwenImagePipeline, QwenText};
pub use rope::ImageShape;
pub use tiny::{write_tiny_qwen_image, TinyQwenImageSpec};
pub use transformer::{QwenImageTransformer, CONDITION_LATENTS, CONDITION_SHAPES};
pub use vae::{write_tiny_qwen_vae, AutoencoderKlQwenImage, QwenVaeConfig};

/// The pipeline class of Qwen-Image-Edit-Plus in `model_index.json`.
pub const EDIT_PLUS: &str = "QwenImageEditPlusPipeline";
