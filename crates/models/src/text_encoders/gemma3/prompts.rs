//! LTX-2's prompt embeddings (`LTX2Pipeline._get_gemma_prompt_embeds`): stripped prompts,
//! tokenized with `<bos>`, truncated and left-padded to `max_sequence_length`, through Gemma-3,
//! every hidden state stacked on a last axis and flattened: (B, L, hidden · (layers + 1)).

use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::Gemma3TextEncoder;
use crate::tokenizer::TextTokenizer;
use crate::ModelError;

/// `max_sequence_length` of `LTX2Pipeline.encode_prompt`.
pub const MAX_SEQUENCE_LENGTH: usize = 1024;

/// The Gemma-3 text encoder with its tokenizer.
pub struct Gemma3PromptEncoder {
    pub encoder: Gemma3TextEncoder,
    pub tokenizer: TextTokenizer,
}

impl Gemma3PromptEncoder {
    /// Loads `text_encoder/` and `tokenizer/` folders of an LTX-2 pipeline.
    pub fn load(
        text_encoder: &Path,
        tokenizer: &Path,
        device: Device,
        kind: Kind,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            encoder: Gemma3TextEncoder::load(text_encoder, device, kind)?,
            tokenizer: TextTokenizer::load(tokenizer)?,
        })
    }

    /// Token ids and attention mask (B, `length`) of `prompts`, as the pipeline's tokenizer call
    /// gives them: each prompt stripped as Python strips it, with the tokenizer's special
    /// tokens (Gemma's leading `<bos>`), cut to its first `length` tokens and padded on the left.
    pub fn tokenize(
        &self,
        prompts: &[&str],
        length: usize,
    ) -> Result<(Tensor, Tensor), ModelError> {
        if length == 0 {
            return Err(ModelError::Input("max_sequence_length must be at least 1".into()));
        }
        let pad = i64::from(self.tokenizer.pad_id());
        let (mut ids, mut mask) = (vec![], vec![]);
        for prompt in prompts {
            let tokens = self.tokenizer.ids(python_strip(prompt))?;
            let kept = &tokens[..tokens.len().min(length)];
            let padding = length - kept.len();
            ids.extend(std::iter::repeat_n(pad, padding));
            ids.extend(kept.iter().map(|&t| i64::from(t)));
            mask.extend(std::iter::repeat_n(0i64, padding));
            mask.extend(std::iter::repeat_n(1i64, kept.len()));
        }
        let shape = [prompts.len() as i64, length as i64];
        Ok((Tensor::from_slice(&ids).view(shape), Tensor::from_slice(&mask).view(shape)))
    }

    /// `prompt_embeds` (B, L, hidden · (layers + 1)) in the encoder's kind and `attention_mask`
    /// (B, L) i64 of `prompts`, L = `max_sequence_length` (the pipeline's default is
    /// [`MAX_SEQUENCE_LENGTH`]); the mask lies on the encoder's device.
    pub fn encode(
        &self,
        prompts: &[&str],
        max_sequence_length: usize,
    ) -> Result<(Tensor, Tensor), ModelError> {
        let (ids, mask) = self.tokenize(prompts, max_sequence_length)?;
        let device = self.encoder.embed_device();
        let (ids, mask) = (ids.to_device(device), mask.to_device(device));
        let embeds = self.encode_ids(&ids, &mask)?;
        Ok((embeds, mask))
    }

    /// The prompt embeddings of token ids and their mask (B, L).
    pub fn encode_ids(&self, ids: &Tensor, mask: &Tensor) -> Result<Tensor, ModelError> {
        let states = self.encoder.hidden_states(ids, mask)?;
        Ok(Tensor::stack(&states, -1).flatten(2, 3))
    }
}

/// `prompt` without the leading and trailing characters Python's `str.strip()` removes: Unicode
/// whitespace and the separators U+001C‥U+001F.
fn python_strip(prompt: &str) -> &str {
    prompt.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}
