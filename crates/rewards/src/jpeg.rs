//! DDPO's JPEG rewards: the file size of the image saved as JPEG at quality 95.
//! `jpeg_incompressibility` = size in kB; `jpeg_compressibility` = −kB/500.
//! (Sizes come from the `image` crate's encoder, so they differ slightly from PIL's.)

use image::codecs::jpeg::JpegEncoder;

use crate::{Reward, RewardError, Sample, Score};

/// The JPEG size scorer, in either direction.
pub struct JpegSize {
    /// true: reward small files (`jpeg_compressibility`).
    pub compressible: bool,
}

/// Bytes of `image` as a quality-95 JPEG.
pub fn jpeg_bytes(image: &image::RgbImage) -> Result<usize, image::ImageError> {
    let mut buffer = Vec::new();
    JpegEncoder::new_with_quality(&mut buffer, 95).encode_image(image)?;
    Ok(buffer.len())
}

impl Reward for JpegSize {
    fn name(&self) -> &str {
        if self.compressible {
            "jpeg_compressibility"
        } else {
            "jpeg_incompressibility"
        }
    }

    fn score(&self, samples: &[Sample<'_>]) -> Result<Vec<Score>, RewardError> {
        samples
            .iter()
            .map(|s| {
                let kb = jpeg_bytes(s.image).map_err(|e| RewardError::Failed {
                    reward: self.name().into(),
                    message: e.to_string(),
                })? as f64
                    / 1000.0;
                Ok(Score {
                    value: if self.compressible { -kb / 500.0 } else { kb },
                    ..Default::default()
                })
            })
            .collect()
    }
}
