//! Wan (`WanPipeline`: Wan2.1 and Wan2.2 text-to-video and TI2V-5B) in the diffusers layout: the
//! `WanTransformer3DModel` denoiser, the `AutoencoderKLWan` causal video VAE and the UMT5 text
//! encoder.

mod block;
mod config;
mod family;
mod pipeline;
mod rope;
mod text;
mod tiny;
mod transformer;
mod vae;
mod vae_config;

pub use config::WanTransformerConfig;
pub use family::FAMILY;
pub use pipeline::{WanPipeline, DEFAULT_NUM_FRAMES};
pub use text::{prompt_embeds, WanTextEncoder, MAX_SEQUENCE_LENGTH};
pub use tiny::{write_tiny_wan, TinyWanSpec};
pub use transformer::{ConditionEmbedder, WanTransformer};
pub use vae::AutoencoderKlWan;
pub use vae_config::WanVaeConfig;
