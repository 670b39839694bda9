//! Qwen-Image.

mod vae;
pub use vae::{write_tiny_qwen_vae, AutoencoderKlQwenImage, QwenVaeConfig};
