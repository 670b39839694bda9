//! FLUX.2 [klein]'s reference images as `Flux2KleinPipeline` prepares them: each picture checked
//! (sides ≥ 64, aspect ratio ≤ 8), brought down to about 1024² pixels (Lanczos) when larger,
//! centre-cropped to multiples of the latent token's side, encoded to normalised 2×2-patch
//! latents, and laid out as tokens with ids `(10·(i + 1), row, column, 0)` for picture i.

use image::{imageops, RgbImage};
use tch::Tensor;

use super::transformer::grid_ids;
use super::{Flux2Vae, Flux2VaeConfig};
use crate::condition_sizes::ConditionSizes;
use crate::pipeline::PipelineDir;
use crate::resize::{resize, Filter};
use crate::ModelError;

/// Pictures larger than this many pixels are resized down to it.
const MAX_AREA: f64 = 1024.0 * 1024.0;
/// The pipeline's `check_image_input` limits.
const MIN_SIDE: u32 = 64;
const MAX_ASPECT: f64 = 8.0;
/// The time coordinate of picture i is `STEP · (i + 1)`.
const STEP: i64 = 10;

/// The size the pipeline resizes a `w` × `h` picture to (itself unless larger than the target
/// area), then the size of its centre crop to multiples of the token side `multiple`; the error
/// names the picture and the limit it breaks.
type Sizes = ((u32, u32), (u32, u32));
fn sized_dims(w: u32, h: u32, index: usize, multiple: u32) -> Result<Sizes, ModelError> {
    let aspect = (w as f64 / h as f64).max(h as f64 / w as f64);
    if w < MIN_SIDE || h < MIN_SIDE || aspect > MAX_ASPECT {
        return Err(ModelError::Input(format!(
            "reference picture {index} is {w}×{h}: FLUX.2 needs sides of at least {MIN_SIDE} and \
             an aspect ratio of at most {MAX_ASPECT}"
        )));
    }
    let area = w as f64 * h as f64;
    let (w, h) = if area > MAX_AREA {
        let scale = (MAX_AREA / area).sqrt();
        ((w as f64 * scale) as u32, (h as f64 * scale) as u32)
    } else {
        (w, h)
    };
    Ok(((w, h), (w / multiple * multiple, h / multiple * multiple)))
}

/// `picture` as the pipeline sizes it for a token side of `multiple` pixels ([`sized_dims`]).
fn sized(picture: &RgbImage, index: usize, multiple: u32) -> Result<RgbImage, ModelError> {
    let ((w, h), (cw, ch)) = sized_dims(picture.width(), picture.height(), index, multiple)?;
    let picture = if (w, h) == picture.dimensions() {
        picture.clone()
    } else {
        resize(picture, w, h, Filter::Lanczos)
    };
    Ok(imageops::crop_imm(&picture, (w - cw) / 2, (h - ch) / 2, cw, ch).to_image())
}

/// What FLUX.2 reference pictures of (width, height) add ([`crate::condition_sizes`]): each as
/// the pipeline sizes it, as tokens of the image stream; the prompt does not see them.
pub fn condition_sizes(
    dir: &PipelineDir,
    rows: &[Vec<(u32, u32)>],
    _: Option<u32>,
) -> Result<Vec<ConditionSizes>, ModelError> {
    let vae: Flux2VaeConfig = crate::read_config(&dir.root.join("vae").join("config.json"))?;
    let multiple = vae.scale_factor() as u32;
    let row = |pictures: &Vec<(u32, u32)>| {
        let mut sizes = ConditionSizes::default();
        for (i, &(w, h)) in pictures.iter().enumerate() {
            sizes.encoded.push(sized_dims(w, h, i, multiple)?.1);
        }
        Ok(sizes)
    };
    rows.iter().map(row).collect()
}

/// Tokens (1, N, 4·C) in f32 and ids (1, N, 4) of `pictures`, one after the other.
pub fn reference_tokens(
    vae: &Flux2Vae,
    pictures: &[RgbImage],
) -> Result<(Tensor, Tensor), ModelError> {
    let multiple = vae.scale_factor() as u32;
    let device = vae.autoencoder.store.device();
    let (mut tokens, mut ids) = (vec![], vec![]);
    for (i, picture) in pictures.iter().enumerate() {
        let picture = sized(picture, i, multiple)?;
        let (w, h) = (picture.width() as i64, picture.height() as i64);
        let pixels = Tensor::from_slice(picture.as_raw()).view([1, h, w, 3]).to_device(device);
        let latents = vae.encode_rgb8(&pixels);
        tokens.push(latents.flatten(2, 3).transpose(1, 2));
        let (rows, cols) = (h / multiple as i64, w / multiple as i64);
        ids.push(grid_ids(STEP * (i as i64 + 1), rows, cols, device));
    }
    Ok((Tensor::cat(&tokens, 1), Tensor::cat(&ids, 0).unsqueeze(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes as the pipeline computes them: `int(side · √(1024² / area))` above 1024² pixels,
    /// then floored to the token side and centre-cropped.
    #[test]
    fn large_pictures_are_brought_to_the_target_area_then_cropped() {
        let picture = RgbImage::from_fn(2048, 1000, |x, y| image::Rgb([x as u8, y as u8, 7]));
        // scale √(1048576 / 2048000) = 0.71554…: 1465 × 715, cropped to 1456 × 704.
        assert_eq!(sized(&picture, 0, 16).unwrap().dimensions(), (1456, 704));
        let small = RgbImage::from_fn(101, 70, |x, y| image::Rgb([x as u8, y as u8, 7]));
        let cropped = sized(&small, 0, 4).unwrap();
        assert_eq!(cropped.dimensions(), (100, 68));
        // Offsets (101 − 100)/2 = 0 and (70 − 68)/2 = 1.
        assert_eq!(cropped.get_pixel(0, 0), small.get_pixel(0, 1));
        let err = sized(&RgbImage::new(600, 64), 2, 16).unwrap_err().to_string();
        assert!(err.contains("reference picture 2 is 600×64"), "{err}");
    }
}
