//! Qwen-Image-Edit-Plus prompt encoding (diffusers' `QwenImageEditPlusPipeline
//! ._get_qwen_prompt_embeds`): the prompt inside the edit chat template after one
//! `Picture i: <|vision_start|><|image_pad|><|vision_end|>` per condition picture, each
//! `<|image_pad|>` expanded to the picture's merged token count (as `Qwen2VLProcessor` does), the
//! vision tower's embeddings in those slots, Qwen2.5-VL's last hidden states with 3-D positions,
//! and the first 64 tokens dropped.
//!
//! diffusers 0.42 with transformers 5 gives the image tokens sequential positions instead (it does
//! not pass `mm_token_type_ids`); this follows the model (transformers 4.x, which derives them).

use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::qwen2_5_vl::Qwen25VlTextEncoder;
use super::qwen2_5_vl_vision::Qwen25VlVision;
use super::qwen2_vl_processor::Qwen2VlImageProcessor;
use super::qwen_prompts::drop_template;
use crate::tokenizer::TextTokenizer;
use crate::ModelError;

/// The template diffusers wraps around the picture placeholders and the prompt.
pub const EDIT_PROMPT_TEMPLATE: &str = "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, background), then explain how the user's text instruction should alter or modify the image. Generate a new image that meets the user's requirements while maintaining consistency with the original input where appropriate.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n";
/// Tokens dropped from the front (`prompt_template_encode_start_idx`).
pub const EDIT_TEMPLATE_START: usize = 64;
/// The image placeholder token of the template.
const IMAGE_PAD: &str = "<|image_pad|>";

/// One condition picture: 8-bit RGB, row-major HWC, already at its condition size.
#[derive(Debug, Clone, Copy)]
pub struct ConditionPicture<'a> {
    pub height: usize,
    pub width: usize,
    pub rgb: &'a [u8],
}

/// The text encoder (with its vision tower), tokenizer and image processor of a
/// Qwen-Image-Edit-Plus pipeline.
pub struct QwenEditPromptEncoder {
    pub encoder: Qwen25VlTextEncoder,
    pub vision: Qwen25VlVision,
    pub tokenizer: TextTokenizer,
    pub processor: Qwen2VlImageProcessor,
}

impl QwenEditPromptEncoder {
    /// Loads `text_encoder_dir` (language model and vision tower) as `kind`, `tokenizer_dir` and
    /// `processor_dir` (`preprocessor_config.json`).
    pub fn load(
        text_encoder_dir: &Path,
        tokenizer_dir: &Path,
        processor_dir: &Path,
        device: Device,
        kind: Kind,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            encoder: Qwen25VlTextEncoder::load(text_encoder_dir, device, kind)?,
            vision: Qwen25VlVision::load(text_encoder_dir, device, kind)?,
            tokenizer: TextTokenizer::load(tokenizer_dir)?,
            processor: Qwen2VlImageProcessor::load(processor_dir)?,
        })
    }

    /// `prompt_embeds` (B, L, D) and `prompt_embeds_mask` (B, L) i64 of `prompts`, each with the
    /// same condition `pictures` (none is allowed): row b is what diffusers computes for
    /// `prompts[b]` alone; rows are zero past their length, where the mask is 0.
    pub fn encode_prompts(
        &self,
        prompts: &[&str],
        pictures: &[ConditionPicture<'_>],
    ) -> Result<(Tensor, Tensor), ModelError> {
        if prompts.is_empty() || prompts.iter().any(|p| p.contains(IMAGE_PAD)) {
            return Err(ModelError::Input(format!(
                "Qwen-Image-Edit prompt encoding needs at least one prompt, none containing \
                 {IMAGE_PAD}; got {prompts:?}"
            )));
        }
        let device = self.encoder.store.device();
        let merge = self.vision.config.spatial_merge_size;
        let mut pixels = Vec::with_capacity(pictures.len());
        let mut grids = Vec::with_capacity(pictures.len());
        let mut placeholders = String::new();
        for (i, p) in pictures.iter().enumerate() {
            let (values, grid) = self.processor.preprocess(p.height, p.width, p.rgb, device)?;
            let tokens = (grid.0 * grid.1 * grid.2 / (merge * merge)) as usize;
            placeholders.push_str(&format!(
                "Picture {}: <|vision_start|>{}<|vision_end|>",
                i + 1,
                IMAGE_PAD.repeat(tokens)
            ));
            pixels.push(values);
            grids.push(grid);
        }
        let texts: Vec<String> = prompts
            .iter()
            .map(|p| EDIT_PROMPT_TEMPLATE.replace("{}", &format!("{placeholders}{p}")))
            .collect();
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        // a token spans at least one byte, so the longest text's bytes never truncate
        let longest = texts.iter().map(|t| t.len()).max().unwrap_or(0);
        let (ids, mask) = self.tokenizer.encode_longest(&texts, longest)?;
        let hidden = if pictures.is_empty() {
            self.encoder.forward(&ids.to_device(device), &mask.to_device(device))?
        } else {
            let embeds = self.vision.forward(&Tensor::cat(&pixels, 0), &grids)?;
            let rows = prompts.len() as i64;
            let embeds = embeds.repeat([rows, 1]);
            let grids = grids.repeat(prompts.len());
            self.encoder.forward_multimodal(
                &ids.to_device(device),
                &mask.to_device(device),
                &embeds,
                &grids,
                merge,
            )?
        };
        drop_template(&hidden, &mask, EDIT_TEMPLATE_START)
    }
}
