//! Qwen-Image 2.1 (`QwenImage21Pipeline`: a single-stream block-causal transformer, Qwen3-VL as
//! text and condition-image encoder, a 64-channel picture VAE) in the diffusers layout, from text
//! and with condition images.

mod block;
mod config;
mod family;
mod layout;
mod pipeline;
mod tiny;
mod transformer;
mod vae;

pub use config::QwenImage21TransformerConfig;
pub use family::FAMILY;
pub use layout::{JointLayout, TOKENS_PER_SLOT};
pub use pipeline::{condition_sizes, PromptStates, QwenImage21Pipeline, QwenImage21PromptEncoder};
pub use tiny::{write_tiny_qwen_image21, TinyQwenImage21Spec};
pub use transformer::{QwenImage21Transformer, ZeroCenterRmsNorm, IMAGE_SLOTS};
pub use vae::{write_tiny_qwen_image21_vae, AutoencoderKlQwenImage21, QwenImage21VaeConfig};

/// LoRA targets of the Qwen-Image 2.1 recipes, as diffusers/PEFT name them: every block's
/// attention projections and SwiGLU layers.
pub const QWEN_IMAGE21_TARGETS: [&str; 7] = [
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "img_mlp.proj",
    "img_mlp.gate_layer",
    "img_mlp.out",
];
