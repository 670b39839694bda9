//! FLUX.1 [dev] and [schnell] (double- then single-stream MMDiT, CLIP-L pooled + T5-XXL text,
//! AutoencoderKL with scaling and shift factors) in the diffusers layout.

mod block;
mod config;
mod rope;
mod transformer;

pub use config::FluxTransformerConfig;
pub use transformer::{FluxTransformer, GUIDANCE};
