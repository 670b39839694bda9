//! Pillow's (13) `Image.resize` for 8-bit RGB and RGBA pictures (RGBA through premultiplied alpha),
//! and its compositing of RGBA over white, reproduced exactly: separable convolution (width first,
//! then height, unless the height shrinks much more) with the filter stretched by the downscale
//! factor, weights normalised per output pixel and turned into 22-bit fixed point, sums rounded
//! half up and clamped to 8 bits after each pass. diffusers' image processors resize with Lanczos
//! (LTX-2's video processor with bilinear), Qwen2-VL's with bicubic; matching Pillow bit for bit keeps reference pictures and latents
//! identical.

use image::{RgbImage, RgbaImage};

/// Pillow's resampling filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// `Image.BILINEAR` (a triangle, support 1).
    Bilinear,
    /// `Image.BICUBIC` (a = −0.5, support 2).
    Bicubic,
    /// `Image.LANCZOS` (sinc windowed by sinc(x/3), support 3).
    Lanczos,
}

/// Pillow's `PRECISION_BITS` for 8-bit pictures: 32 − 8 − 2.
const PRECISION_BITS: u32 = 22;

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        let x = x * std::f64::consts::PI;
        x.sin() / x
    }
}

impl Filter {
    fn support(self) -> f64 {
        match self {
            Filter::Bilinear => 1.0,
            Filter::Bicubic => 2.0,
            Filter::Lanczos => 3.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        match self {
            Filter::Bilinear => (1.0 - x.abs()).max(0.0),
            Filter::Bicubic => {
                const A: f64 = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
            Filter::Lanczos => {
                if (-3.0..3.0).contains(&x) {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
        }
    }
}

/// The taps of one output pixel: the first input index and fixed-point weights.
struct Taps {
    first: usize,
    weights: Vec<i64>,
}

/// Pillow's `precompute_coeffs` and `normalize_coeffs_8bpc` for `input` → `output` samples.
fn taps(input: usize, output: usize, filter: Filter) -> Vec<Taps> {
    let scale = input as f64 / output as f64;
    let filter_scale = scale.max(1.0);
    let support = filter.support() * filter_scale;
    // Pillow multiplies by the reciprocal; dividing would move some weights by an ulp.
    let inverse = 1.0 / filter_scale;
    (0..output)
        .map(|i| {
            let center = (i as f64 + 0.5) * scale;
            let first = ((center - support + 0.5) as i64).max(0) as usize;
            let end = ((center + support + 0.5) as i64).min(input as i64) as usize;
            let raw: Vec<f64> =
                (first..end).map(|x| filter.weight((x as f64 - center + 0.5) * inverse)).collect();
            let total: f64 = raw.iter().sum();
            let unit = (1i64 << PRECISION_BITS) as f64;
            let weights = raw
                .iter()
                .map(|&w| {
                    let w = if total != 0.0 { w / total } else { w };
                    if w < 0.0 {
                        (-0.5 + w * unit) as i64
                    } else {
                        (0.5 + w * unit) as i64
                    }
                })
                .collect();
            Taps { first, weights }
        })
        .collect()
}

/// Pillow's `clip8`: a fixed-point sum back to 8 bits.
fn clip8(sum: i64) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// One pass over an (h, w) buffer of `channels` interleaved 8-bit channels (`shape`),
/// resampling the width (`along_width`) or the height to `out_len` samples.
fn pass(
    input: &[u8],
    (shape, channels): ((usize, usize), usize),
    out_len: usize,
    along_width: bool,
    filter: Filter,
) -> Vec<u8> {
    let (h, w) = shape;
    let (len, lines) = if along_width { (w, h) } else { (h, w) };
    let taps = taps(len, out_len, filter);
    let (oh, ow) = if along_width { (h, out_len) } else { (out_len, w) };
    let mut out = vec![0u8; oh * ow * channels];
    let index = |line: usize, at: usize, width: usize| {
        if along_width {
            (line * width + at) * channels
        } else {
            (at * width + line) * channels
        }
    };
    for line in 0..lines {
        for (o, t) in taps.iter().enumerate() {
            for c in 0..channels {
                let mut sum = 1i64 << (PRECISION_BITS - 1);
                for (k, &weight) in t.weights.iter().enumerate() {
                    sum += input[index(line, t.first + k, w) + c] as i64 * weight;
                }
                out[index(line, o, ow) + c] = clip8(sum);
            }
        }
    }
    out
}

/// `picture.resize((width, height), filter)` as Pillow computes it.
pub fn resize(picture: &RgbImage, width: u32, height: u32, filter: Filter) -> RgbImage {
    let size = (picture.width(), picture.height());
    let pixels = resample(picture.as_raw().clone(), size, 3, (width, height), filter);
    RgbImage::from_raw(width, height, pixels).expect("the resized buffer has the output size")
}

/// Pillow's `MULDIV255` / `DIV255`: `a / 255` rounded as its 8-bit blends do.
fn div255(a: u32) -> u8 {
    let t = a + 128;
    (((t >> 8) + t) >> 8) as u8
}

/// `picture.resize((width, height), filter)` of an RGBA picture as Pillow computes it: through
/// premultiplied `RGBa` (`MULDIV255`) and back (`255·c / α` truncated; α 0 and 255 copied).
pub fn resize_rgba(picture: &RgbaImage, width: u32, height: u32, filter: Filter) -> RgbaImage {
    let mut pixels = picture.as_raw().clone();
    for p in pixels.chunks_mut(4) {
        let alpha = p[3] as u32;
        for c in &mut p[..3] {
            *c = div255(*c as u32 * alpha);
        }
    }
    let size = (picture.width(), picture.height());
    let mut pixels = resample(pixels, size, 4, (width, height), filter);
    for p in pixels.chunks_mut(4) {
        let alpha = p[3] as u32;
        if alpha != 0 && alpha != 255 {
            for c in &mut p[..3] {
                *c = (255 * *c as u32 / alpha).min(255) as u8;
            }
        }
    }
    RgbaImage::from_raw(width, height, pixels).expect("the resized buffer has the output size")
}

/// An RGBA picture composited over white (Pillow's `paste` with the alpha as mask).
pub fn over_white(picture: &RgbaImage) -> RgbImage {
    let pixels = picture
        .as_raw()
        .chunks(4)
        .flat_map(|p| {
            let alpha = p[3] as u32;
            let blend = move |c: u8| div255(255 * (255 - alpha) + c as u32 * alpha);
            [blend(p[0]), blend(p[1]), blend(p[2])]
        })
        .collect();
    RgbImage::from_raw(picture.width(), picture.height(), pixels).expect("an RGB buffer")
}

/// Both separable passes over `channels` interleaved channels, in Pillow's order.
fn resample(
    mut pixels: Vec<u8>,
    (w, h): (u32, u32),
    channels: usize,
    (ow, oh): (u32, u32),
    filter: Filter,
) -> Vec<u8> {
    let (w, h, ow, oh) = (w as usize, h as usize, ow as usize, oh as usize);
    // Pillow 13 resamples the height first when it shrinks more than twice as many rows as
    // columns go (a faster second pass); the order changes the 8-bit rounding in between.
    let (dh, dw) = (h as i64 - oh as i64, w as i64 - ow as i64);
    if dh > 0 && dh > 2 * dw {
        if oh != h {
            pixels = pass(&pixels, ((h, w), channels), oh, false, filter);
        }
        if ow != w {
            pixels = pass(&pixels, ((oh, w), channels), ow, true, filter);
        }
    } else {
        if ow != w {
            pixels = pass(&pixels, ((h, w), channels), ow, true, filter);
        }
        if oh != h {
            pixels = pass(&pixels, ((h, ow), channels), oh, false, filter);
        }
    }
    pixels
}
