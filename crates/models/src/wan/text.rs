//! Wan's prompt encoding: UMT5 (`UMT5EncoderModel`) over the prompt padded to
//! `max_sequence_length` with its attention mask; WanPipeline keeps each prompt's own tokens'
//! states and sets the padded positions to zero, and the transformer reads that without a mask.

use std::path::Path;

use tch::{Device, Kind, Tensor};

use crate::prompt_clean::clean_prompt;
use crate::text_encoders::t5::T5Encoder;
use crate::tokenizer::TextTokenizer;
use crate::ModelError;

/// WanPipeline's default `max_sequence_length`.
pub const MAX_SEQUENCE_LENGTH: usize = 512;

/// WanPipeline's prompt embeds (B, `length`, d) from token ids and attention mask (B, L ≤
/// `length`): the encoder's last hidden state under the mask, zero where the mask is zero and
/// beyond L.
pub fn prompt_embeds(
    encoder: &T5Encoder,
    ids: &Tensor,
    mask: &Tensor,
    length: i64,
) -> Result<Tensor, ModelError> {
    let states = encoder.forward_masked(ids, Some(mask))?;
    let (b, l, d) = states.size3()?;
    if l > length {
        return Err(ModelError::Input(format!(
            "{l} prompt tokens exceed max_sequence_length {length}"
        )));
    }
    let keep = mask.ne(0).unsqueeze(-1).to_kind(states.kind());
    let kept = states * keep;
    let pad = Tensor::zeros([b, length - l, d], (kept.kind(), kept.device()));
    Ok(Tensor::cat(&[kept, pad], 1))
}

/// The tokenizer and UMT5 encoder of a Wan pipeline.
pub struct WanTextEncoder {
    pub tokenizer: TextTokenizer,
    pub encoder: T5Encoder,
    pub max_sequence_length: usize,
}

impl WanTextEncoder {
    /// Loads `tokenizer_dir` (with `tokenizer.json`) and the `text_encoder/` folder.
    pub fn load(
        tokenizer_dir: &Path,
        encoder_dir: &Path,
        device: Device,
        kind: Kind,
    ) -> Result<Self, ModelError> {
        let encoder = T5Encoder::load(encoder_dir, device, kind)?;
        if !encoder.config.bias_per_block() {
            return Err(ModelError::Format {
                path: encoder_dir.join("config.json").display().to_string(),
                message: format!(
                    "model_type is {:?}; Wan's text encoder is UMT5 (`umt5`)",
                    encoder.config.model_type
                ),
            });
        }
        Ok(Self {
            tokenizer: TextTokenizer::load(tokenizer_dir)?,
            encoder,
            max_sequence_length: MAX_SEQUENCE_LENGTH,
        })
    }

    /// Prompt embeds (B, max_sequence_length, d) and the prompt mask (B, max_sequence_length)
    /// of `prompts`, truncated to `max_sequence_length` tokens, each cleaned first as WanPipeline
    /// does ([`crate::prompt_clean::clean_prompt`]: ftfy's fixes, HTML entities, whitespace).
    pub fn encode(&self, prompts: &[&str]) -> Result<(Tensor, Tensor), ModelError> {
        let cleaned: Vec<String> = prompts.iter().map(|p| clean_prompt(p)).collect();
        let refs: Vec<&str> = cleaned.iter().map(String::as_str).collect();
        let (ids, mask) = self.tokenizer.encode_longest(&refs, self.max_sequence_length)?;
        let device = self.encoder.store.device();
        let (ids, mask) = (ids.to_device(device), mask.to_device(device));
        let length = self.max_sequence_length as i64;
        let embeds = prompt_embeds(&self.encoder, &ids, &mask, length)?;
        let pad = Tensor::zeros([mask.size()[0], length - mask.size()[1]], (Kind::Int64, device));
        Ok((embeds, Tensor::cat(&[mask, pad], 1)))
    }
}
