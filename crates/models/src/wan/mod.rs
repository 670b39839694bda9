//! Wan (`WanPipeline`: Wan2.1 and Wan2.2 text-to-video, TI2V-5B and the two-expert T2V-A14B) in
//! the diffusers layout: the `WanTransformer3DModel` denoiser (or two experts), the
//! `AutoencoderKLWan` causal video VAE and the UMT5 text encoder.

mod block;
mod config;
mod experts;
mod family;
mod pipeline;
mod rope;
mod text;
mod tiny;
mod transformer;
mod vae;
mod vae_config;

pub use config::WanTransformerConfig;
pub use experts::{second_expert_file, WanExperts, SECOND_EXPERT};
pub use family::FAMILY;
pub use pipeline::{WanDenoiser, WanPipeline, DEFAULT_NUM_FRAMES};
pub use text::{prompt_embeds, WanTextEncoder, MAX_SEQUENCE_LENGTH};
pub use tiny::{write_tiny_wan, TinyWanSpec, A14B_BOUNDARY_RATIO};
pub use transformer::{ConditionEmbedder, WanTransformer};
pub use vae::AutoencoderKlWan;
pub use vae_config::WanVaeConfig;
