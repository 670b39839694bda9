//! Stable Diffusion 3 / 3.5 (MMDiT) in the diffusers layout.

mod attention;
mod block;
mod config;
mod embeddings;
mod transformer;

pub use config::Sd3TransformerConfig;
pub use transformer::Sd3Transformer;
