//! `Qwen2VLImageProcessor` for one RGB picture: `smart_resize` to multiples of patch × merge within
//! the pixel bounds, Pillow's bicubic resize exactly ([`crate::resize`]; what transformers uses
//! without torchvision), scaling to [0, 1], CLIP normalisation, the frame repeated
//! `temporal_patch_size` times, and the patches flattened in merge-block order into
//! `(grid_h·grid_w, C·T·P·P)`.

use std::path::Path;

use image::RgbImage;
use serde::Deserialize;
use tch::{Device, Kind, Tensor};

use crate::resize::{resize, Filter};
use crate::{read_config, ModelError};

/// `size` of a Qwen2-VL processor config: pixel bounds.
#[derive(Debug, Clone, Deserialize)]
struct PixelBounds {
    shortest_edge: Option<i64>,
    longest_edge: Option<i64>,
}

/// The `preprocessor_config.json` fields, with transformers' defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
struct ConfigFile {
    do_resize: bool,
    resample: i64,
    do_rescale: bool,
    rescale_factor: f64,
    do_normalize: bool,
    image_mean: [f64; 3],
    image_std: [f64; 3],
    patch_size: i64,
    temporal_patch_size: i64,
    merge_size: i64,
    min_pixels: Option<i64>,
    max_pixels: Option<i64>,
    size: Option<PixelBounds>,
}

impl Default for ConfigFile {
    fn default() -> Self {
        let d = Qwen2VlImageProcessor::default();
        Self {
            do_resize: d.do_resize,
            resample: 3,
            do_rescale: d.do_rescale,
            rescale_factor: d.rescale_factor,
            do_normalize: d.do_normalize,
            image_mean: d.image_mean,
            image_std: d.image_std,
            patch_size: d.patch_size,
            temporal_patch_size: d.temporal_patch_size,
            merge_size: d.merge_size,
            min_pixels: None,
            max_pixels: None,
            size: None,
        }
    }
}

/// The Qwen2-VL image processor settings (bicubic resampling only).
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2VlImageProcessor {
    pub do_resize: bool,
    pub min_pixels: i64,
    pub max_pixels: i64,
    pub do_rescale: bool,
    pub rescale_factor: f64,
    pub do_normalize: bool,
    pub image_mean: [f64; 3],
    pub image_std: [f64; 3],
    pub patch_size: i64,
    pub temporal_patch_size: i64,
    pub merge_size: i64,
}

impl Default for Qwen2VlImageProcessor {
    fn default() -> Self {
        Self {
            do_resize: true,
            min_pixels: 56 * 56,
            max_pixels: 28 * 28 * 1280,
            do_rescale: true,
            rescale_factor: 1.0 / 255.0,
            do_normalize: true,
            image_mean: [0.48145466, 0.4578275, 0.40821073],
            image_std: [0.26862954, 0.26130258, 0.27577711],
            patch_size: 14,
            temporal_patch_size: 2,
            merge_size: 2,
        }
    }
}

impl Qwen2VlImageProcessor {
    /// `dir/preprocessor_config.json`, else the `image_processor` of `dir/processor_config.json`
    /// (Qwen3-VL's processors), or the defaults when the folder has neither; `min_pixels` /
    /// `max_pixels` win over `size.shortest_edge` / `size.longest_edge`, as in transformers.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let (file, nested) =
            (dir.join("preprocessor_config.json"), dir.join("processor_config.json"));
        let bad = |file: &Path, message: String| ModelError::Format {
            path: file.display().to_string(),
            message,
        };
        let (file, raw): (_, ConfigFile) = if file.exists() {
            (file.clone(), read_config(&file)?)
        } else if nested.exists() {
            let value: serde_json::Value = read_config(&nested)?;
            let raw = serde_json::from_value(value["image_processor"].clone())
                .map_err(|e| bad(&nested, format!("image_processor: {e}")))?;
            (nested, raw)
        } else {
            return Ok(Self::default());
        };
        let bad = |message: String| bad(&file, message);
        if raw.resample != 3 {
            return Err(bad(format!(
                "resample {} is not supported; expected 3 (bicubic)",
                raw.resample
            )));
        }
        let d = Self::default();
        let size = raw.size.as_ref();
        let min_pixels =
            raw.min_pixels.or(size.and_then(|s| s.shortest_edge)).unwrap_or(d.min_pixels);
        let max_pixels =
            raw.max_pixels.or(size.and_then(|s| s.longest_edge)).unwrap_or(d.max_pixels);
        if min_pixels < 1 || max_pixels < min_pixels {
            return Err(bad(format!(
                "pixel bounds {min_pixels}‥{max_pixels}: expected 1 ≤ min_pixels ≤ max_pixels"
            )));
        }
        if raw.patch_size < 1 || raw.merge_size < 1 || raw.temporal_patch_size < 1 {
            return Err(bad("patch_size, merge_size and temporal_patch_size must be ≥ 1".into()));
        }
        Ok(Self {
            do_resize: raw.do_resize,
            min_pixels,
            max_pixels,
            do_rescale: raw.do_rescale,
            rescale_factor: raw.rescale_factor,
            do_normalize: raw.do_normalize,
            image_mean: raw.image_mean,
            image_std: raw.image_std,
            patch_size: raw.patch_size,
            temporal_patch_size: raw.temporal_patch_size,
            merge_size: raw.merge_size,
        })
    }

    /// transformers' `smart_resize`: the (height, width) in multiples of patch × merge nearest the
    /// picture's (Python's round-half-to-even) whose area lies within the pixel bounds.
    pub fn smart_resize(&self, height: i64, width: i64) -> Result<(i64, i64), ModelError> {
        let factor = self.patch_size * self.merge_size;
        let (h, w, f) = (height as f64, width as f64, factor as f64);
        if height < 1 || width < 1 || h.max(w) / h.min(w) > 200.0 {
            return Err(ModelError::Input(format!(
                "a {height}×{width} picture: expected positive sides with an aspect ratio ≤ 200"
            )));
        }
        let mut hb = (h / f).round_ties_even() as i64 * factor;
        let mut wb = (w / f).round_ties_even() as i64 * factor;
        if hb * wb > self.max_pixels {
            let beta = (h * w / self.max_pixels as f64).sqrt();
            hb = factor.max((h / beta / f).floor() as i64 * factor);
            wb = factor.max((w / beta / f).floor() as i64 * factor);
        } else if hb * wb < self.min_pixels {
            let beta = (self.min_pixels as f64 / (h * w)).sqrt();
            hb = (h * beta / f).ceil() as i64 * factor;
            wb = (w * beta / f).ceil() as i64 * factor;
        }
        Ok((hb, wb))
    }

    /// `pixel_values` (grid_h·grid_w, 3·T·P·P) f32 on `device` and the grid `(1, grid_h, grid_w)`
    /// of one 8-bit RGB picture, `pixels` row-major HWC.
    pub fn preprocess(
        &self,
        height: usize,
        width: usize,
        pixels: &[u8],
        device: Device,
    ) -> Result<(Tensor, (i64, i64, i64)), ModelError> {
        if pixels.len() != height * width * 3 {
            return Err(ModelError::Input(format!(
                "an RGB picture of {height}×{width} needs {} bytes, got {}",
                height * width * 3,
                pixels.len()
            )));
        }
        let (h, w) = (height as i64, width as i64);
        let (rh, rw) = if self.do_resize { self.smart_resize(h, w)? } else { (h, w) };
        let (p, m, t) = (self.patch_size, self.merge_size, self.temporal_patch_size);
        if rh % (p * m) != 0 || rw % (p * m) != 0 {
            return Err(ModelError::Input(format!(
                "a {rh}×{rw} picture cannot be cut into merged patches of {}",
                p * m
            )));
        }
        let picture = RgbImage::from_raw(width as u32, height as u32, pixels.to_vec())
            .expect("the length was checked");
        let picture = resize(&picture, rw as u32, rh as u32, Filter::Bicubic);
        let mut x = Tensor::from_slice(picture.as_raw())
            .view([rh, rw, 3])
            .permute([2, 0, 1])
            .unsqueeze(0)
            .to_device(device)
            .to_kind(Kind::Float);
        if self.do_rescale {
            x *= self.rescale_factor;
        }
        if self.do_normalize {
            let per_channel = |v: &[f64; 3]| {
                Tensor::from_slice(v).to_kind(Kind::Float).view([1, 3, 1, 1]).to_device(device)
            };
            x = (x - per_channel(&self.image_mean)) / per_channel(&self.image_std);
        }
        let (gh, gw) = (rh / p, rw / p);
        let patches = x
            .view(&[3, gh / m, m, p, gw / m, m, p][..])
            .permute([1, 4, 2, 5, 0, 3, 6])
            .unsqueeze(5)
            .expand([gh / m, gw / m, m, m, 3, t, p, p], false)
            .reshape([gh * gw, 3 * t * p * p]);
        Ok((patches, (1, gh, gw)))
    }
}
