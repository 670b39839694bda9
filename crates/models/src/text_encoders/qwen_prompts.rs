//! Qwen-Image prompt encoding (diffusers' `QwenImagePipeline.encode_prompt`): each prompt inside
//! the chat template with its system prompt, Qwen2.5-VL's last hidden states, the 34 template
//! tokens before the prompt dropped, rows re-padded with zeros to the longest prompt.

use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::qwen2_5_vl::Qwen25VlTextEncoder;
use crate::tokenizer::TextTokenizer;
use crate::ModelError;

/// The template diffusers wraps around each prompt.
pub const PROMPT_TEMPLATE: &str = "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n";
/// Template tokens before the prompt (`prompt_template_encode_start_idx`).
pub const TEMPLATE_START: usize = 34;
/// The longest `max_sequence_length` the pipeline accepts (`tokenizer_max_length`).
pub const MAX_SEQUENCE_LENGTH: usize = 1024;

/// The text encoder and tokenizer of a Qwen-Image pipeline.
pub struct QwenPromptEncoder {
    pub encoder: Qwen25VlTextEncoder,
    pub tokenizer: TextTokenizer,
}

impl QwenPromptEncoder {
    /// Loads `text_encoder_dir` (config.json + safetensors) as `kind` and `tokenizer_dir`.
    pub fn load(
        text_encoder_dir: &Path,
        tokenizer_dir: &Path,
        device: Device,
        kind: Kind,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            encoder: Qwen25VlTextEncoder::load(text_encoder_dir, device, kind)?,
            tokenizer: TextTokenizer::load(tokenizer_dir)?,
        })
    }

    /// `prompt_embeds` (B, L, D) and `prompt_embeds_mask` (B, L) i64 of `prompts` as diffusers'
    /// `encode_prompt(prompts, max_sequence_length=…)` computes them: L is the longest prompt's
    /// token count, at most `max_sequence_length`; rows are zero past their length, where the mask
    /// is 0. Unlike diffusers, the mask is returned even when it is all ones. A negative prompt
    /// (" ") is encoded like any other.
    pub fn encode_prompts(
        &self,
        prompts: &[&str],
        max_sequence_length: usize,
    ) -> Result<(Tensor, Tensor), ModelError> {
        if prompts.is_empty() || !(1..=MAX_SEQUENCE_LENGTH).contains(&max_sequence_length) {
            return Err(ModelError::Input(format!(
                "Qwen-Image prompt encoding needs at least one prompt and max_sequence_length in \
                 1..={MAX_SEQUENCE_LENGTH}, got {} prompts and {max_sequence_length}",
                prompts.len()
            )));
        }
        let texts: Vec<String> = prompts.iter().map(|p| PROMPT_TEMPLATE.replace("{}", p)).collect();
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        // diffusers tokenizes up to 1024 + 34 tokens and keeps the first max_sequence_length
        // states; the encoder is causal, so stopping the tokens there gives the same states.
        let (ids, mask) =
            self.tokenizer.encode_longest(&texts, max_sequence_length + TEMPLATE_START)?;
        let device = self.encoder.store.device();
        let hidden = self.encoder.forward(&ids.to_device(device), &mask.to_device(device))?;
        drop_template(&hidden, &mask, TEMPLATE_START)
    }
}

/// The states of `hidden` (B, L, D) after the first `start` tokens of each row's `mask` (B, L)
/// (right padding), re-padded with zeros to the longest row, and their mask (B, L') i64.
pub(super) fn drop_template(
    hidden: &Tensor,
    mask: &Tensor,
    start: usize,
) -> Result<(Tensor, Tensor), ModelError> {
    let lengths: Vec<i64> = Vec::<i64>::try_from(mask.sum_dim_intlist(1, false, Kind::Int64))?
        .into_iter()
        .map(|n| (n - start as i64).max(0))
        .collect();
    let longest = lengths.iter().copied().max().unwrap_or(0);
    let (b, d) = (hidden.size()[0], hidden.size()[2]);
    let device = hidden.device();
    let embeds = Tensor::zeros([b, longest, d], (hidden.kind(), device));
    let out_mask = Tensor::zeros([b, longest], (Kind::Int64, device));
    for (row, &n) in lengths.iter().enumerate() {
        let row = row as i64;
        let states = hidden.get(row).narrow(0, start as i64, n);
        embeds.get(row).narrow(0, 0, n).copy_(&states);
        let _ = out_mask.get(row).narrow(0, 0, n).fill_(1);
    }
    Ok((embeds, out_mask))
}
