//! Qwen-Image (MMDiT with dual-stream blocks, a Qwen2.5-VL text encoder and a causal 3-D VAE) in
//! the diffusers layout.

mod block;
mod config;
mod rope;
mod transformer;

pub use config::QwenImageTransformerConfig;
pub use rope::ImageShape;
pub use transformer::{QwenImageTransformer, CONDITION_LATENTS, CONDITION_SHAPES};
