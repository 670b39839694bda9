//! Pictures people look at: a grid PNG of a step's images, with a JSONL of their captions.

use std::path::Path;

use flowtune_rewards::RgbImage;

use crate::TrainError;

/// Tiles `images` (all the same size) into a near-square grid.
pub fn grid(images: &[RgbImage]) -> RgbImage {
    let n = images.len().max(1) as u32;
    let cols = (n as f64).sqrt().ceil() as u32;
    let rows = n.div_ceil(cols);
    let (w, h) = images.first().map_or((1, 1), |i| i.dimensions());
    let mut out = RgbImage::new(cols * w, rows * h);
    for (i, img) in images.iter().enumerate() {
        let (x, y) = ((i as u32 % cols) * w, (i as u32 / cols) * h);
        for (px, py, p) in img.enumerate_pixels() {
            out.put_pixel(x + px, y + py, *p);
        }
    }
    out
}

/// Writes `<stem>.png` (the grid) and `<stem>.jsonl` (one caption per tile: prompt and score).
pub fn save_grid(
    dir: &Path,
    stem: &str,
    images: &[RgbImage],
    captions: &[(String, f64)],
) -> Result<(), TrainError> {
    std::fs::create_dir_all(dir).map_err(|e| TrainError::Io(format!("{}: {e}", dir.display())))?;
    let png = dir.join(format!("{stem}.png"));
    grid(images).save(&png).map_err(|e| TrainError::Io(format!("{}: {e}", png.display())))?;
    let lines: Vec<String> = captions
        .iter()
        .enumerate()
        .map(|(i, (prompt, score))| {
            serde_json::json!({ "index": i, "prompt": prompt, "score": score }).to_string()
        })
        .collect();
    let jsonl = dir.join(format!("{stem}.jsonl"));
    std::fs::write(&jsonl, lines.join("\n") + "\n")
        .map_err(|e| TrainError::Io(format!("{}: {e}", jsonl.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_places_tiles_row_major() {
        let tiles: Vec<RgbImage> =
            (0..5u8).map(|i| RgbImage::from_pixel(2, 3, image::Rgb([i, 0, 0]))).collect();
        let g = grid(&tiles);
        assert_eq!(g.dimensions(), (6, 6));
        assert_eq!(g.get_pixel(0, 0)[0], 0);
        assert_eq!(g.get_pixel(4, 0)[0], 2);
        assert_eq!(g.get_pixel(2, 3)[0], 4);
        assert_eq!(g.get_pixel(4, 3)[0], 0, "empty cells stay black");
    }
}
