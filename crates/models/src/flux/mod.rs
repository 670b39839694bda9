//! FLUX.1 [dev] and [schnell] (double- then single-stream MMDiT, CLIP-L pooled + T5-XXL text,
//! AutoencoderKL with scaling and shift factors) in the diffusers layout.

pub(crate) mod block;
mod config;
mod family;
mod pipeline;
pub(crate) mod rope;
pub(crate) mod tiny;
mod transformer;

pub use config::FluxTransformerConfig;
pub use family::FAMILY;
pub use pipeline::{FluxPipeline, DEFAULT_GUIDANCE};
pub use rope::position_ids;
pub use tiny::{write_tiny_flux, TinyFluxSpec};
pub use transformer::{FluxTransformer, GUIDANCE};
