//! `flowtune make-tiny ltx2`: a complete random `LTX2Pipeline` directory in the diffusers layout
//! (LTX-2.0's by default, LTX-2.3's with `ltx23`), loadable and runnable by diffusers. Video and
//! audio tokens are both 8 wide: the video VAE's 8 latent channels, the audio VAE's 2 channels ×
//! 4 latent mel bins.

use std::path::Path;

use flowtune_sampling::SampleRng;
use serde_json::json;
use tch::Kind;

use super::audio_vae::{AutoencoderKlLtx2Audio, Ltx2AudioVaeConfig};
use super::connectors::{write_tiny_ltx2_connectors, Ltx2ConnectorsConfig};
use super::transformer::{write_random_transformer, Ltx2TransformerConfig};
use super::video_vae::{AutoencoderKlLtx2Video, Ltx2VideoVaeConfig};
use super::vocoder::{Ltx2Vocoder, Ltx2VocoderBweConfig, Ltx2VocoderClass, Ltx2VocoderConfig};
use crate::sd3::tiny::{write_scheduler, DIFFUSERS_VERSION};
use crate::sd3::WeightInit;
use crate::text_encoders::gemma3::tiny::{write_tiny_gemma3_text_encoder, TinyGemma3Spec};
use crate::{write_json, ModelError};

/// Sizes of a tiny LTX-2 pipeline.
#[derive(Debug, Clone, Default)]
pub struct TinyLtx2Spec {
    pub seed: u64,
    /// LTX-2.3's layout: gated attention, text modulation, per-modality connector projections,
    /// split rotary and the bandwidth-extending vocoder.
    pub ltx23: bool,
    /// The transformer's dtype; f32 when `None`.
    pub dtype: Option<Kind>,
}

/// Width of the video and of the audio tokens.
const TOKEN_WIDTH: i64 = 8;

/// The tiny transformer of `spec` for connectors giving `video_text` / `audio_text` wide states
/// (LTX-2.3) or `caption`-wide ones (LTX-2.0).
fn transformer_config(spec: &TinyLtx2Spec, caption: i64) -> Ltx2TransformerConfig {
    let base = Ltx2TransformerConfig {
        in_channels: TOKEN_WIDTH,
        out_channels: Some(TOKEN_WIDTH),
        audio_in_channels: TOKEN_WIDTH,
        audio_out_channels: Some(TOKEN_WIDTH),
        caption_channels: caption,
        ..Ltx2TransformerConfig::tiny()
    };
    if !spec.ltx23 {
        return base;
    }
    // 2 × 12 wide: the connectors' 24-wide video states, and the audio↔video rotary (16 wide)
    // splits over 2 heads.
    base.with_ltx23_layout(12, 24)
}

/// Writes the pipeline into `dir` (created if missing).
pub fn write_tiny_ltx2(dir: &Path, spec: &TinyLtx2Spec) -> Result<(), ModelError> {
    let gemma = TinyGemma3Spec::default();
    write_tiny_gemma3_text_encoder(
        &dir.join("text_encoder"),
        &dir.join("tokenizer"),
        spec.seed,
        &gemma,
    )?;
    let layers = gemma.layers as i64 + 1;
    let connectors = Ltx2ConnectorsConfig::tiny(gemma.hidden_size, layers, spec.ltx23);
    write_tiny_ltx2_connectors(&dir.join("connectors"), spec.seed + 1, &connectors)?;

    let vae = Ltx2VideoVaeConfig { latent_channels: TOKEN_WIDTH, ..Ltx2VideoVaeConfig::tiny() };
    AutoencoderKlLtx2Video::write_random(&dir.join("vae"), spec.seed + 2, &vae)?;
    let audio_vae = Ltx2AudioVaeConfig::tiny();
    AutoencoderKlLtx2Audio::write_random(&dir.join("audio_vae"), spec.seed + 3, &audio_vae)?;
    let vocoder = if spec.ltx23 {
        Ltx2VocoderClass::WithBwe(Box::new(Ltx2VocoderBweConfig::tiny()))
    } else {
        Ltx2VocoderClass::Plain(Ltx2VocoderConfig::tiny())
    };
    Ltx2Vocoder::write_random(&dir.join("vocoder"), spec.seed + 4, &vocoder)?;

    let config = transformer_config(spec, gemma.hidden_size);
    let mut rng = SampleRng::new(spec.seed + 5);
    let kind = spec.dtype.unwrap_or(Kind::Float);
    write_random_transformer(
        &dir.join("transformer"),
        &config,
        &mut rng,
        WeightInit::Normal(0.1),
        kind,
    )?;

    // The released dev checkpoints' scheduler (convert_ltx2_to_diffusers.py).
    write_scheduler(
        dir,
        &json!({
            "_class_name": "FlowMatchEulerDiscreteScheduler",
            "_diffusers_version": DIFFUSERS_VERSION,
            "num_train_timesteps": 1000,
            "shift": 1.0,
            "use_dynamic_shifting": true,
            "base_shift": 0.95,
            "max_shift": 2.05,
            "base_image_seq_len": 1024,
            "max_image_seq_len": 4096,
            "shift_terminal": 0.1,
            "time_shift_type": "exponential"
        }),
    )?;
    write_json(
        &dir.join("model_index.json"),
        &json!({
            "_class_name": "LTX2Pipeline",
            "_diffusers_version": DIFFUSERS_VERSION,
            "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
            "vae": ["diffusers", "AutoencoderKLLTX2Video"],
            "audio_vae": ["diffusers", "AutoencoderKLLTX2Audio"],
            "text_encoder": ["transformers", "Gemma3ForConditionalGeneration"],
            "tokenizer": ["transformers", "GemmaTokenizerFast"],
            "connectors": ["ltx2", "LTX2TextConnectors"],
            "transformer": ["diffusers", "LTX2VideoTransformer3DModel"],
            "vocoder": ["ltx2", vocoder.class_name()],
        }),
    )
}
