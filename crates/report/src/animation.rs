//! Moving pictures: an animated GIF of a sequence of frames (a grid of clips, frame by frame).

use std::path::Path;

use image::codecs::gif::{GifEncoder, Repeat};
use image::{Delay, Frame, RgbImage};

/// Writes `frames` (all the same size) as a looping GIF at `fps` frames per second.
pub fn write_gif(path: &Path, frames: &[RgbImage], fps: u32) -> Result<(), image::ImageError> {
    let file = std::fs::File::create(path).map_err(image::ImageError::IoError)?;
    let mut encoder = GifEncoder::new_with_speed(std::io::BufWriter::new(file), 10);
    encoder.set_repeat(Repeat::Infinite)?;
    let delay = Delay::from_numer_denom_ms(1000, fps.max(1));
    encoder.encode_frames(frames.iter().map(|f| {
        Frame::from_parts(image::DynamicImage::ImageRgb8(f.clone()).to_rgba8(), 0, 0, delay)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::AnimationDecoder;

    #[test]
    fn a_gif_holds_every_frame_in_order() {
        let frames: Vec<RgbImage> = (0..3u8)
            .map(|i| RgbImage::from_pixel(8, 6, image::Rgb([i * 100, 0, 255 - i * 100])))
            .collect();
        let dir = flowtune_fixtures::scratch("gif");
        let path = dir.join("frames.gif");
        write_gif(&path, &frames, 8).unwrap();
        let file = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
        let decoded = image::codecs::gif::GifDecoder::new(file)
            .unwrap()
            .into_frames()
            .collect_frames()
            .unwrap();
        assert_eq!(decoded.len(), 3);
        for (d, f) in decoded.iter().zip(&frames) {
            let px = d.buffer().get_pixel(3, 3);
            let want = f.get_pixel(3, 3);
            // GIF quantises to a palette; flat colours come back within a few levels.
            for c in 0..3 {
                assert!((px[c] as i32 - want[c] as i32).abs() <= 4, "{px:?} vs {want:?}");
            }
        }
        let _ = std::fs::remove_file(path);
    }
}
