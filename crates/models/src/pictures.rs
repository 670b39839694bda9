//! Condition pictures as every family receives them: 8-bit RGBA (alpha 255 where the file has
//! none). Qwen-Image 2.1 reads the alpha as its pipeline does; the others take opaque pictures
//! only, as RGB, and refuse any with a transparent pixel rather than drop its alpha.

use image::{RgbImage, RgbaImage};

use crate::ModelError;

/// How many pixels of `picture` are not fully opaque.
pub fn transparent_pixels(picture: &RgbaImage) -> usize {
    picture.pixels().filter(|p| p.0[3] != 255).count()
}

/// The RGB of opaque `pictures`, for a `class` pipeline that takes no alpha; a picture with a
/// transparent pixel is refused, naming its place in the list.
pub fn opaque_rgb(pictures: &[RgbaImage], class: &str) -> Result<Vec<RgbImage>, ModelError> {
    pictures
        .iter()
        .enumerate()
        .map(|(i, picture)| match transparent_pixels(picture) {
            0 => Ok(image::DynamicImage::ImageRgba8(picture.clone()).to_rgb8()),
            n => Err(ModelError::Input(format!(
                "condition picture {} of {} ({}×{}) has {n} transparent pixels: a {class} takes \
                 opaque pictures only (flatten it onto a background first)",
                i + 1,
                pictures.len(),
                picture.width(),
                picture.height()
            ))),
        })
        .collect()
}

/// The one first-frame picture of image-to-video rows (opaque, as RGB), or `None` without
/// pictures; more than one is refused.
pub fn first_frame(pictures: &[RgbaImage], class: &str) -> Result<Option<RgbImage>, ModelError> {
    let mut pictures = opaque_rgb(pictures, class)?;
    match pictures.len() {
        0 | 1 => Ok(pictures.pop()),
        many => Err(ModelError::Input(format!(
            "image-to-video takes one first-frame picture per prompt, got {many}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opaque_pictures_lose_only_their_alpha_and_translucent_ones_are_refused() {
        let opaque = RgbaImage::from_fn(3, 2, |x, y| image::Rgba([x as u8, y as u8, 7, 255]));
        let rgb = opaque_rgb(std::slice::from_ref(&opaque), "WanPipeline").unwrap();
        assert_eq!(rgb[0].get_pixel(2, 1).0, [2, 1, 7]);
        let mut translucent = opaque.clone();
        translucent.get_pixel_mut(1, 1).0[3] = 128;
        assert_eq!(transparent_pixels(&translucent), 1);
        let err = opaque_rgb(&[opaque, translucent], "WanPipeline").unwrap_err().to_string();
        assert!(err.contains("condition picture 2 of 2 (3×2) has 1 transparent pixels"), "{err}");
        assert!(err.contains("WanPipeline takes opaque pictures only"), "{err}");
    }
}
