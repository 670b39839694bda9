//! A grid of images, each scaled up to a cell and captioned underneath.

use image::imageops::FilterType;
use image::Rgb;

use crate::text::{draw_text, wrap};
use crate::RgbImage;

/// The text under one tile; `verdict` colours it (green true, red false, grey none).
#[derive(Debug, Clone, PartialEq)]
pub struct Caption {
    pub text: String,
    pub verdict: Option<bool>,
}

const PAD: u32 = 6;
const LINE: u32 = 10;

/// Tiles `images` in `columns` columns, each resized to `cell` × `cell` (nearest neighbour when
/// enlarging, so pixels stay crisp) with its caption wrapped below in at most `caption_lines`
/// lines, on white.
pub fn captioned_grid(
    images: &[RgbImage],
    captions: &[Caption],
    cell: u32,
    columns: u32,
    caption_lines: u32,
) -> RgbImage {
    let columns = columns.clamp(1, images.len().max(1) as u32);
    let rows = (images.len() as u32).div_ceil(columns).max(1);
    let (w, h) = (cell + 2 * PAD, cell + 2 * PAD + caption_lines * LINE);
    let mut out = RgbImage::from_pixel(columns * w, rows * h, Rgb([255, 255, 255]));
    let chars_per_line = (cell / 8) as usize;
    for (i, img) in images.iter().enumerate() {
        let (x, y) = ((i as u32 % columns) * w + PAD, (i as u32 / columns) * h + PAD);
        let filter = if img.width() <= cell { FilterType::Nearest } else { FilterType::Triangle };
        let scaled = image::imageops::resize(img, cell, cell, filter);
        image::imageops::replace(&mut out, &scaled, x as i64, y as i64);
        let Some(caption) = captions.get(i) else { continue };
        let colour = match caption.verdict {
            Some(true) => Rgb([0, 128, 0]),
            Some(false) => Rgb([190, 0, 0]),
            None => Rgb([60, 60, 60]),
        };
        for (l, line) in
            wrap(&caption.text, chars_per_line).iter().take(caption_lines as usize).enumerate()
        {
            let ty = y + cell + 3 + l as u32 * LINE;
            draw_text(&mut out, x as i64, ty as i64, line, colour, 1);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_are_scaled_into_their_cells_with_captions_below() {
        let red = RgbImage::from_pixel(4, 4, Rgb([255, 0, 0]));
        let blue = RgbImage::from_pixel(4, 4, Rgb([0, 0, 255]));
        let caption = |t: &str, v| Caption { text: t.into(), verdict: v };
        let g = captioned_grid(
            &[red, blue.clone(), blue],
            &[caption("yes", Some(true)), caption("no", Some(false))],
            32,
            2,
            2,
        );
        let (w, h) = (32 + 2 * PAD, 32 + 2 * PAD + 2 * LINE);
        assert_eq!(g.dimensions(), (2 * w, 2 * h));
        assert_eq!(*g.get_pixel(PAD + 16, PAD + 16), Rgb([255, 0, 0]));
        assert_eq!(*g.get_pixel(w + PAD + 16, PAD + 16), Rgb([0, 0, 255]));
        assert_eq!(*g.get_pixel(PAD + 16, h + PAD + 16), Rgb([0, 0, 255]));
        let in_caption = |x0: u32, colour: Rgb<u8>| {
            (x0..x0 + 32).any(|x| (PAD + 35..h).any(|y| *g.get_pixel(x, y) == colour))
        };
        assert!(in_caption(PAD, Rgb([0, 128, 0])), "green caption under the first tile");
        assert!(in_caption(w + PAD, Rgb([190, 0, 0])), "red caption under the second");
    }
}
