//! Qwen-Image-Edit-Plus (`QwenImageEditPlusPipeline`): the prompt is encoded together with the
//! condition pictures (resized to about 384² for the vision tower), and the pictures' VAE latents
//! (resized to about 1024²) ride on the image stream as extra tokens the prediction ignores.

use std::collections::BTreeMap;

use image::RgbImage;
use tch::{Kind, Tensor};

use super::pipeline::QwenText;
use super::{QwenImagePipeline, CONDITION_LATENTS, CONDITION_SHAPES, EDIT_PLUS};
use crate::condition_sizes::{marker_tokens, tokenizer_in, ConditionSizes};
use crate::family::{run_on, FlowPipeline};
use crate::pipeline::PipelineDir;
use crate::resize::{resize, Filter};
use crate::text_encoders::qwen2_vl_processor::Qwen2VlImageProcessor;
use crate::text_encoders::qwen_edit_prompts::ConditionPicture;
use crate::{ModelError, TextConditioning};

/// Pixel area of the pictures the vision tower sees (diffusers' `CONDITION_IMAGE_SIZE`).
const CONDITION_AREA: f64 = 384.0 * 384.0;
/// Pixel area the pictures are VAE-encoded at (diffusers' `VAE_IMAGE_SIZE`).
const VAE_AREA: f64 = 1024.0 * 1024.0;

/// diffusers' `calculate_dimensions`: (width, height) covering `area` pixels at aspect `ratio`
/// (width / height), each rounded (half to even, as Python) to a multiple of 32.
pub fn calculate_dimensions(area: f64, ratio: f64) -> (u32, u32) {
    let width = (area * ratio).sqrt();
    let height = width / ratio;
    let multiple = |v: f64| ((v / 32.0).round_ties_even() * 32.0) as u32;
    (multiple(width), multiple(height))
}

/// `picture` resized with Pillow's Lanczos to `area` pixels at its own aspect ratio.
fn at_area(picture: &RgbImage, area: f64) -> RgbImage {
    let (w, h) = calculate_dimensions(area, picture.width() as f64 / picture.height() as f64);
    resize(picture, w, h, Filter::Lanczos)
}

/// What Edit-Plus condition pictures of (width, height) add ([`crate::condition_sizes`]): each
/// VAE-encoded at about 1024², and its vision tokens (about 384², through the folder's
/// `processor`) with their words and markers (`Picture 1: <|vision_start|>…<|vision_end|>`, in
/// the folder's tokenizer) in the prompt, which is then cut at `max_sequence_length`. Plain
/// Qwen-Image takes no pictures.
pub fn condition_sizes(
    dir: &PipelineDir,
    rows: &[Vec<(u32, u32)>],
    _: Option<u32>,
) -> Result<Vec<ConditionSizes>, ModelError> {
    if dir.index.class_name != EDIT_PLUS {
        return Ok(vec![ConditionSizes::default(); rows.len()]);
    }
    let processor = Qwen2VlImageProcessor::load(&dir.root.join("processor"))?;
    let tokenizer = tokenizer_in(&dir.root.join("tokenizer"))?;
    let cell = processor.patch_size * processor.merge_size;
    let row = |pictures: &Vec<(u32, u32)>| {
        let mut sizes = ConditionSizes { cut_at_max_sequence_length: true, ..Default::default() };
        for (i, &(w, h)) in pictures.iter().enumerate() {
            let ratio = w as f64 / h as f64;
            sizes.encoded.push(calculate_dimensions(VAE_AREA, ratio));
            let (seen_w, seen_h) = calculate_dimensions(CONDITION_AREA, ratio);
            let (rh, rw) = processor.smart_resize(seen_h as i64, seen_w as i64)?;
            let words = format!("Picture {}: ", i + 1);
            sizes.text_tokens +=
                ((rh / cell) * (rw / cell)) as u64 + marker_tokens(tokenizer.as_ref(), &words)?;
        }
        Ok(sizes)
    };
    rows.iter().map(row).collect()
}

impl QwenImagePipeline {
    /// Edit-Plus conditioning of `prompts`, which all share the condition `pictures` (none: the
    /// text-only template): prompt states and mask, and the extras [`CONDITION_LATENTS`] (the
    /// pictures' packed, normalised VAE latents in order) and [`CONDITION_SHAPES`] (their token
    /// grids).
    pub fn encode_edit(
        &self,
        prompts: &[&str],
        pictures: &[RgbImage],
    ) -> Result<TextConditioning, ModelError> {
        let QwenText::Edit(encoder) = crate::random::built(&self.text, &self.dir)? else {
            return Err(ModelError::Input(format!(
                "{}: condition pictures need a {EDIT_PLUS}, this is a {}",
                self.dir.root.display(),
                self.dir.index.class_name
            )));
        };
        let small: Vec<RgbImage> = pictures.iter().map(|p| at_area(p, CONDITION_AREA)).collect();
        let views: Vec<ConditionPicture<'_>> = small
            .iter()
            .map(|p| ConditionPicture {
                height: p.height() as usize,
                width: p.width() as usize,
                rgb: p.as_raw(),
            })
            .collect();
        let (embeds, mask) = encoder.encode_prompts(prompts, &views)?;
        let mut text = self.conditioning(embeds, mask);
        if !pictures.is_empty() {
            text.extras.extend(self.condition_latents(pictures, prompts.len()));
        }
        Ok(text)
    }

    /// [`CONDITION_LATENTS`] (the pictures' packed, normalised VAE latents at about 1024², in
    /// order) and [`CONDITION_SHAPES`] (their token grids), one copy per row.
    pub fn condition_latents(
        &self,
        pictures: &[RgbImage],
        rows: usize,
    ) -> BTreeMap<String, Tensor> {
        let device = self.device();
        let cell = self.vae_scale_factor() * self.transformer.config.patch_size;
        let mut tokens = vec![];
        let mut grids = vec![];
        for picture in pictures.iter().map(|p| at_area(p, VAE_AREA)) {
            let (w, h) = (picture.width() as i64, picture.height() as i64);
            let pixels = Tensor::from_slice(picture.as_raw())
                .view([1, h, w, 3])
                .permute([0, 3, 1, 2])
                .to_device(device)
                .to_kind(Kind::Float)
                / 255.0
                * 2.0
                - 1.0;
            let latents = run_on(self.vae.store.device(), &pixels, |p| self.vae.encode(p).0)
                .to_kind(Kind::Float);
            tokens.push(self.transformer.pack(&latents));
            grids.extend([1, h / cell, w / cell]);
        }
        let (b, n) = (rows as i64, pictures.len() as i64);
        let latents = Tensor::cat(&tokens, 1).expand([b, -1, -1], false).contiguous();
        let grids = Tensor::from_slice(&grids).view([1, n, 3]).expand([b, n, 3], false);
        BTreeMap::from([
            (CONDITION_LATENTS.into(), latents),
            (CONDITION_SHAPES.into(), grids.contiguous().to_device(device)),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dimensions_round_like_python() {
        // 1024² at 4:3: width √(1048576·4/3) = 1182.4 → 1184, height 886.8 → 896.
        assert_eq!(calculate_dimensions(VAE_AREA, 4.0 / 3.0), (1184, 896));
        assert_eq!(calculate_dimensions(CONDITION_AREA, 1.0), (384, 384));
        // 48 / 32 = 1.5 and 80 / 32 = 2.5 round to even: 64 and 64.
        assert_eq!(calculate_dimensions(48.0 * 48.0, 1.0), (64, 64));
        assert_eq!(calculate_dimensions(80.0 * 80.0, 1.0), (64, 64));
    }
}
