//! Z-Image (`ZImagePipeline`: a single-stream DiT, a Qwen3 text encoder, FLUX's AutoencoderKL)
//! in the diffusers layout, text-to-image only.

mod block;
mod config;
mod family;
mod pipeline;
mod rope;
pub(crate) mod tiny;
mod transformer;

pub use config::ZImageTransformerConfig;
pub use family::FAMILY;
pub use pipeline::{ZImagePipeline, ZImagePromptEncoder, CHAT_TEMPLATE, TEXT_ENCODER_CLASSES};
pub use tiny::{write_tiny_z_image, TinyZImageSpec};
pub use transformer::{valid_tokens, ZImageTransformer, SEQ_MULTI_OF};

/// Width of the timestep embedding the adaLN layers read (at most `dim`).
pub const ADALN_EMBED_DIM: i64 = 256;

/// LoRA targets of the Z-Image recipes: every block's attention projections and SwiGLU layers,
/// as diffusers/PEFT name them.
pub const Z_IMAGE_TARGETS: [&str; 7] =
    ["to_q", "to_k", "to_v", "to_out.0", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3"];
