//! `CLIPImageProcessor`: the shorter side resized (antialiased bicubic in 8 bits, as PIL does), a centre crop, scaling to [0, 1] and per-channel normalisation — read from the
//! model folder's `preprocessor_config.json`.

use std::path::Path;

use serde::Deserialize;
use tch::{Device, Kind, Tensor};

use crate::{read_config, ModelError};

/// A size in a processor config: an int (legacy), `{shortest_edge}` or `{height, width}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum SizeSpec {
    Int(i64),
    ShortestEdge { shortest_edge: i64 },
    Exact { height: i64, width: i64 },
}

/// Mirror of the `preprocessor_config.json` fields CLIP uses (defaults: OpenAI CLIP's).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct ClipImageProcessor {
    pub do_resize: bool,
    pub size: SizeSpec,
    /// PIL filter id: 3 bicubic (the CLIP default), 2 bilinear.
    pub resample: i64,
    pub do_center_crop: bool,
    pub crop_size: SizeSpec,
    pub do_rescale: bool,
    pub rescale_factor: f64,
    pub do_normalize: bool,
    pub image_mean: [f64; 3],
    pub image_std: [f64; 3],
}

impl Default for ClipImageProcessor {
    fn default() -> Self {
        Self {
            do_resize: true,
            size: SizeSpec::ShortestEdge { shortest_edge: 224 },
            resample: 3,
            do_center_crop: true,
            crop_size: SizeSpec::Exact { height: 224, width: 224 },
            do_rescale: true,
            rescale_factor: 1.0 / 255.0,
            do_normalize: true,
            image_mean: [0.48145466, 0.4578275, 0.40821073],
            image_std: [0.26862954, 0.26130258, 0.27577711],
        }
    }
}

impl ClipImageProcessor {
    /// `dir/preprocessor_config.json`, or the defaults when the folder has none.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let file = dir.join("preprocessor_config.json");
        let processor: Self = if file.exists() { read_config(&file)? } else { Self::default() };
        if ![2, 3].contains(&processor.resample) {
            return Err(ModelError::Format {
                path: file.display().to_string(),
                message: format!(
                    "resample {} is not supported; expected 3 (bicubic) or 2 (bilinear)",
                    processor.resample
                ),
            });
        }
        Ok(processor)
    }

    /// The size an `h` × `w` image is resized to.
    fn resized(&self, h: i64, w: i64) -> (i64, i64) {
        let shortest = |s: i64| {
            let (short, long) = (h.min(w), h.max(w));
            let long = (s as f64 * long as f64 / short as f64) as i64;
            if h <= w {
                (s, long)
            } else {
                (long, s)
            }
        };
        match self.size {
            SizeSpec::Int(s) | SizeSpec::ShortestEdge { shortest_edge: s } => shortest(s),
            SizeSpec::Exact { height, width } => (height, width),
        }
    }

    /// Model inputs (B, 3, crop_h, crop_w) f32 on `device` from 8-bit RGB images, each given as
    /// `(height, width, pixels)` with pixels row-major HWC.
    pub fn pixel_values(
        &self,
        images: &[(usize, usize, &[u8])],
        device: Device,
    ) -> Result<Tensor, ModelError> {
        let (ch, cw) = match self.crop_size {
            SizeSpec::Int(s) | SizeSpec::ShortestEdge { shortest_edge: s } => (s, s),
            SizeSpec::Exact { height, width } => (height, width),
        };
        let mut out = vec![];
        for &(h, w, pixels) in images {
            if pixels.len() != h * w * 3 || h == 0 || w == 0 {
                return Err(ModelError::Input(format!(
                    "an RGB image of {h}×{w} needs {} bytes, got {}",
                    h * w * 3,
                    pixels.len()
                )));
            }
            // Resized in 8 bits on the CPU: libtorch's uint8 antialiased kernels clamp between
            // the two passes as PIL does (within one level of it; the float kernels overshoot).
            let mut x = Tensor::from_slice(pixels)
                .view([h as i64, w as i64, 3])
                .permute([2, 0, 1])
                .unsqueeze(0);
            if self.do_resize {
                let (rh, rw) = self.resized(h as i64, w as i64);
                x = if self.resample == 3 {
                    x.f_internal_upsample_bicubic2d_aa([rh, rw], false, None, None)?
                } else {
                    x.f_internal_upsample_bilinear2d_aa([rh, rw], false, None, None)?
                };
            }
            let mut x = x.to_device(device).to_kind(Kind::Float);
            if self.do_center_crop {
                let (xh, xw) = (x.size()[2], x.size()[3]);
                if xh < ch || xw < cw {
                    return Err(ModelError::Input(format!(
                        "an image of {xh}×{xw} after resizing is smaller than the crop {ch}×{cw}"
                    )));
                }
                x = x.narrow(2, (xh - ch) / 2, ch).narrow(3, (xw - cw) / 2, cw);
            }
            if self.do_rescale {
                x *= self.rescale_factor;
            }
            if self.do_normalize {
                let mean = Tensor::from_slice(&self.image_mean)
                    .to_kind(Kind::Float)
                    .view([1, 3, 1, 1])
                    .to_device(device);
                let std = Tensor::from_slice(&self.image_std)
                    .to_kind(Kind::Float)
                    .view([1, 3, 1, 1])
                    .to_device(device);
                x = (x - mean) / std;
            }
            out.push(x);
        }
        Ok(Tensor::cat(&out, 0))
    }
}
