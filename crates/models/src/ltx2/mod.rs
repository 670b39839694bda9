//! LTX-2 (`LTX2Pipeline`: text-to-video with sound, and `LTX2ImageToVideoPipeline`) in the
//! diffusers layout: the `LTX2VideoTransformer3DModel` that denoises video and audio latents
//! together, the Gemma-3 text encoder with `LTX2TextConnectors`, the `AutoencoderKLLTX2Video`
//! and `AutoencoderKLLTX2Audio` VAEs and the `LTX2Vocoder`.

pub mod audio_vae;
pub mod connectors;
mod family;
pub mod latents;
mod pipeline;
mod tiny;
pub mod transformer;
pub mod video_vae;
pub mod vocoder;

pub use family::FAMILY;
pub use pipeline::{Ltx2Pipeline, Ltx2Text, DEFAULT_FRAME_RATE, DEFAULT_NUM_FRAMES};
pub use tiny::{write_tiny_ltx2, TinyLtx2Spec};
