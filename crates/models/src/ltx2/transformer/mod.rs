//! `LTX2VideoTransformer3DModel` (LTX-2.0 and LTX-2.3 layouts): the audio-video DiT that denoises
//! packed video tokens and audio tokens together, and its joint-latent [`crate::Denoiser`].

mod attention;
mod block;
mod config;
mod denoiser;
mod model;
mod rope;
mod tiny;

pub use attention::{AttentionSpec, BlockNorm, Ltx2Attention, Over};
pub use block::{FeedForward, Ltx2Block};
pub use config::Ltx2TransformerConfig;
pub use denoiser::{AUDIO_EMBEDS, FPS, VIDEO_SHAPE};
pub use model::{AdaLnSingle, CaptionProjection, Ltx2Inputs, Ltx2Transformer};
pub use rope::{Rope, Ropes};
pub use tiny::write_random_transformer;

/// LoRA targets as PEFT names them: the four projections of every attention (video, audio, their
/// text cross-attentions and the audio↔video ones) and both feed-forwards' linears.
pub const LTX2_TARGETS: [&str; 28] = [
    "attn1.to_q",
    "attn1.to_k",
    "attn1.to_v",
    "attn1.to_out.0",
    "attn2.to_q",
    "attn2.to_k",
    "attn2.to_v",
    "attn2.to_out.0",
    "audio_attn1.to_q",
    "audio_attn1.to_k",
    "audio_attn1.to_v",
    "audio_attn1.to_out.0",
    "audio_attn2.to_q",
    "audio_attn2.to_k",
    "audio_attn2.to_v",
    "audio_attn2.to_out.0",
    "audio_to_video_attn.to_q",
    "audio_to_video_attn.to_k",
    "audio_to_video_attn.to_v",
    "audio_to_video_attn.to_out.0",
    "video_to_audio_attn.to_q",
    "video_to_audio_attn.to_k",
    "video_to_audio_attn.to_v",
    "video_to_audio_attn.to_out.0",
    "ff.net.0.proj",
    "ff.net.2",
    "audio_ff.net.0.proj",
    "audio_ff.net.2",
];
