//! The pixel operations of the OCR pipeline, on 8-bit BGR pictures: OpenCV's bilinear resize
//! (half-pixel centres), the bicubic perspective crop of a text box (border replicated), a
//! quarter turn and black letterbox bands.

use crate::RgbImage;

/// An 8-bit picture, 3 channels interleaved in BGR order (the order PP-OCR was trained on).
#[derive(Debug, Clone, PartialEq)]
pub struct Picture {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
}

impl Picture {
    /// The picture of an RGB image, channels swapped to BGR.
    pub fn from_rgb(image: &RgbImage) -> Self {
        let data = image.pixels().flat_map(|p| [p[2], p[1], p[0]]).collect();
        Self { width: image.width() as usize, height: image.height() as usize, data }
    }

    fn at(&self, x: usize, y: usize, c: usize) -> u8 {
        self.data[(y * self.width + x) * 3 + c]
    }

    /// Resized to `width` × `height` by bilinear interpolation with half-pixel centres, edges
    /// clamped (OpenCV's `INTER_LINEAR`, no antialiasing).
    pub fn resize(&self, width: usize, height: usize) -> Picture {
        let taps = |dst: usize, src: usize| -> Vec<(usize, usize, f32)> {
            let scale = src as f64 / dst as f64;
            (0..dst)
                .map(|d| {
                    let f = (d as f64 + 0.5) * scale - 0.5;
                    let i = f.floor();
                    let (i, t) = if i < 0.0 {
                        (0, 0.0)
                    } else if i as usize >= src - 1 {
                        (src - 1, 0.0)
                    } else {
                        (i as usize, f - i)
                    };
                    (i, (i + 1).min(src - 1), t as f32)
                })
                .collect()
        };
        let (xs, ys) = (taps(width, self.width), taps(height, self.height));
        let mut data = Vec::with_capacity(width * height * 3);
        for &(y0, y1, ty) in &ys {
            for &(x0, x1, tx) in &xs {
                for c in 0..3 {
                    let top =
                        self.at(x0, y0, c) as f32 * (1.0 - tx) + self.at(x1, y0, c) as f32 * tx;
                    let bottom =
                        self.at(x0, y1, c) as f32 * (1.0 - tx) + self.at(x1, y1, c) as f32 * tx;
                    data.push(saturate(top * (1.0 - ty) + bottom * ty));
                }
            }
        }
        Picture { width, height, data }
    }

    /// Black bands of `top` rows above and below.
    pub fn pad_vertically(&self, top: usize) -> Picture {
        let band = vec![0; top * self.width * 3];
        let data = [band.as_slice(), &self.data, &band].concat();
        Picture { width: self.width, height: self.height + 2 * top, data }
    }

    /// Turned a quarter counter-clockwise (`numpy.rot90`).
    pub fn rotate_counter_clockwise(&self) -> Picture {
        let (w, h) = (self.height, self.width);
        let mut data = Vec::with_capacity(self.data.len());
        for y in 0..h {
            for x in 0..w {
                let (sx, sy) = (self.width - 1 - y, x);
                data.extend_from_slice(&self.data[(sy * self.width + sx) * 3..][..3]);
            }
        }
        Picture { width: w, height: h, data }
    }

    /// The quadrilateral `corners` (top-left, top-right, bottom-right, bottom-left) warped to an
    /// upright `width` × `height` picture: perspective map, bicubic taps (a = −0.75) on a 1/32
    /// pixel grid, border replicated — OpenCV's `warpPerspective(INTER_CUBIC, BORDER_REPLICATE)`.
    pub fn warp_quad(&self, corners: &[[f64; 2]; 4], width: usize, height: usize) -> Picture {
        let (w, h) = (width as f64, height as f64);
        let target = [[0.0, 0.0], [w, 0.0], [w, h], [0.0, h]];
        let m = perspective(&target, corners);
        let mut data = Vec::with_capacity(width * height * 3);
        for y in 0..height {
            for x in 0..width {
                let (xf, yf) = (x as f64, y as f64);
                let den = m[6] * xf + m[7] * yf + m[8];
                let den = if den != 0.0 { 1.0 / den } else { 0.0 };
                let sx = (m[0] * xf + m[1] * yf + m[2]) * den;
                let sy = (m[3] * xf + m[4] * yf + m[5]) * den;
                // OpenCV rounds the source position to 1/32 of a pixel.
                let (qx, qy) = ((sx * 32.0).round() as i64, (sy * 32.0).round() as i64);
                let (ix, iy) = (qx.div_euclid(32), qy.div_euclid(32));
                let (wx, wy) = (
                    cubic_weights(qx.rem_euclid(32) as f64 / 32.0),
                    cubic_weights(qy.rem_euclid(32) as f64 / 32.0),
                );
                for c in 0..3 {
                    let mut sum = 0.0;
                    for (j, wyj) in wy.iter().enumerate() {
                        let py = (iy - 1 + j as i64).clamp(0, self.height as i64 - 1) as usize;
                        for (i, wxi) in wx.iter().enumerate() {
                            let px = (ix - 1 + i as i64).clamp(0, self.width as i64 - 1) as usize;
                            sum += wyj * wxi * self.at(px, py, c) as f64;
                        }
                    }
                    data.push(saturate(sum as f32));
                }
            }
        }
        Picture { width, height, data }
    }
}

fn saturate(v: f32) -> u8 {
    v.round().clamp(0.0, 255.0) as u8
}

/// Keys' cubic convolution weights (a = −0.75) of the 4 taps around fraction `t`.
fn cubic_weights(t: f64) -> [f64; 4] {
    const A: f64 = -0.75;
    let near = |d: f64| ((A + 2.0) * d - (A + 3.0)) * d * d + 1.0;
    let far = |d: f64| ((A * d - 5.0 * A) * d + 8.0 * A) * d - 4.0 * A;
    let w = [far(t + 1.0), near(t), near(1.0 - t), 0.0];
    [w[0], w[1], w[2], 1.0 - w[0] - w[1] - w[2]]
}

/// The 3 × 3 projective map (row-major, m[8] = 1) taking each `from` point to its `to` point.
fn perspective(from: &[[f64; 2]; 4], to: &[[f64; 2]; 4]) -> [f64; 9] {
    let mut a = [[0.0f64; 9]; 8];
    for i in 0..4 {
        let ([x, y], [u, v]) = (from[i], to[i]);
        a[i] = [x, y, 1.0, 0.0, 0.0, 0.0, -x * u, -y * u, u];
        a[i + 4] = [0.0, 0.0, 0.0, x, y, 1.0, -x * v, -y * v, v];
    }
    // Gaussian elimination with partial pivoting on the 8 × 8 system.
    for col in 0..8 {
        let pivot =
            (col..8).max_by(|&p, &q| a[p][col].abs().total_cmp(&a[q][col].abs())).unwrap_or(col);
        a.swap(col, pivot);
        let d = a[col][col];
        if d.abs() < 1e-12 {
            continue;
        }
        let pivot_row = a[col];
        for (r, row) in a.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / d;
                for (x, p) in row.iter_mut().zip(&pivot_row).skip(col) {
                    *x -= f * p;
                }
            }
        }
    }
    let mut m = [0.0; 9];
    for (i, row) in a.iter().enumerate() {
        m[i] = if row[i].abs() < 1e-12 { 0.0 } else { row[8] / row[i] };
    }
    m[8] = 1.0;
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(width: usize, height: usize) -> Picture {
        let data = (0..width * height * 3).map(|i| (i * 7 % 251) as u8).collect();
        Picture { width, height, data }
    }

    #[test]
    fn resize_to_the_same_size_is_the_identity_and_doubling_interpolates() {
        let p = ramp(5, 4);
        assert_eq!(p.resize(5, 4), p);
        let row = Picture { width: 2, height: 1, data: vec![0, 0, 0, 100, 100, 100] };
        let up = row.resize(4, 1);
        // Half-pixel centres: sources at −0.25, 0.25, 0.75, 1.25 → 0, 25, 75, 100.
        assert_eq!(up.data.chunks(3).map(|c| c[0]).collect::<Vec<_>>(), [0, 25, 75, 100]);
    }

    #[test]
    fn an_integer_shift_crops_exactly_and_rotation_turns_counter_clockwise() {
        let p = ramp(8, 6);
        let crop = p.warp_quad(&[[2.0, 1.0], [6.0, 1.0], [6.0, 4.0], [2.0, 4.0]], 4, 3);
        for y in 0..3 {
            for x in 0..4 {
                assert_eq!(crop.at(x, y, 1), p.at(x + 2, y + 1, 1));
            }
        }
        let r = p.rotate_counter_clockwise();
        assert_eq!((r.width, r.height), (6, 8));
        // The top-right corner comes to the top-left.
        assert_eq!(r.at(0, 0, 0), p.at(7, 0, 0));
        assert_eq!(r.at(5, 7, 2), p.at(0, 5, 2));
    }

    #[test]
    fn cubic_weights_sum_to_one_and_interpolate_at_the_grid() {
        assert_eq!(cubic_weights(0.0), [0.0, 1.0, 0.0, 0.0]);
        let w = cubic_weights(0.5);
        assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!((w[0] - -0.09375).abs() < 1e-12 && (w[1] - 0.59375).abs() < 1e-12);
    }
}
