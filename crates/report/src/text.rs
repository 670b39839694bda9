//! Text in the 8×8 public-domain bitmap font, scaled by whole pixels.

use font8x8::UnicodeFonts;
use image::Rgb;

use crate::RgbImage;

/// Glyph cell width and height in font pixels.
const CELL: u32 = 8;

/// Width in pixels of `text` at `scale`.
pub fn text_width(text: &str, scale: u32) -> u32 {
    text.chars().count() as u32 * CELL * scale
}

/// Draws `text` with its top-left corner at (`x`, `y`); pixels outside the image are skipped and
/// characters the font lacks are drawn as `?`.
pub fn draw_text(image: &mut RgbImage, x: i64, y: i64, text: &str, colour: Rgb<u8>, scale: u32) {
    let fallback = font8x8::BASIC_FONTS.get('?').expect("the font has '?'");
    for (i, c) in text.chars().enumerate() {
        let glyph = font8x8::BASIC_FONTS.get(c).unwrap_or(fallback);
        let left = x + (i as u32 * CELL * scale) as i64;
        for (row, bits) in glyph.iter().enumerate() {
            for col in 0..CELL {
                if bits >> col & 1 == 0 {
                    continue;
                }
                for dy in 0..scale {
                    for dx in 0..scale {
                        let px = left + (col * scale + dx) as i64;
                        let py = y + (row as u32 * scale + dy) as i64;
                        if px >= 0
                            && py >= 0
                            && (px as u32) < image.width()
                            && (py as u32) < image.height()
                        {
                            image.put_pixel(px as u32, py as u32, colour);
                        }
                    }
                }
            }
        }
    }
}

/// Splits `text` into lines of at most `columns` characters, breaking at spaces where it can.
pub fn wrap(text: &str, columns: usize) -> Vec<String> {
    let columns = columns.max(1);
    let mut lines = vec![];
    let mut line = String::new();
    for word in text.split_whitespace() {
        let mut word = word.to_string();
        while word.chars().count() > columns {
            if !line.is_empty() {
                lines.push(std::mem::take(&mut line));
            }
            let head: String = word.chars().take(columns).collect();
            word = word.chars().skip(columns).collect();
            lines.push(head);
        }
        let needed = line.chars().count() + usize::from(!line.is_empty()) + word.chars().count();
        if needed > columns && !line.is_empty() {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(&word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_spaces_and_splits_long_words() {
        assert_eq!(wrap("a photo of a red circle", 10), ["a photo of", "a red", "circle"]);
        assert_eq!(wrap("abcdefghij k", 4), ["abcd", "efgh", "ij k"]);
        assert!(wrap("   ", 5).is_empty());
    }

    #[test]
    fn draws_glyph_pixels_inside_the_image_only() {
        let mut img = RgbImage::new(20, 10);
        draw_text(&mut img, -4, 1, "II", Rgb([255, 255, 255]), 1);
        let lit = img.pixels().filter(|p| p[0] == 255).count();
        // 'I' is 6 rows of 2 pixels + 2 bars of 4 (8x8 font): some of the first one is clipped.
        assert!(lit > 10 && lit < 2 * 64, "{lit}");
        assert_eq!(text_width("abc", 2), 48);
    }
}
