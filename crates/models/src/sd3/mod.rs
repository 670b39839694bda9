//! Stable Diffusion 3 / 3.5 (MMDiT) in the diffusers layout.

mod attention;
mod block;
mod config;
mod embeddings;
mod family;
mod pipeline;
pub(crate) mod tiny;
mod transformer;

pub use config::Sd3TransformerConfig;
pub use family::FAMILY;
pub use pipeline::{ClipBranch, Sd3Pipeline};
pub use tiny::{write_tiny_sd3, TinySd3Spec, WeightInit};
pub use transformer::Sd3Transformer;
