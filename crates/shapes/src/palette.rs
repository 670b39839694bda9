//! The colours shapes are drawn in, the background, and the pixel classifier.

use std::fmt;

use image::Rgb;
use serde::{Deserialize, Serialize};

/// The background every scene is drawn on (white).
pub const BACKGROUND: Rgb<u8> = Rgb([255, 255, 255]);

/// A pixel farther than this (Euclidean RGB) from every colour–background blend is no colour.
pub const MAX_RESIDUAL: f64 = 50.0;

/// A shape colour. The RGB values are far apart (≥ 171 between any two) and so are their blends
/// with the background: a half-and-half blend of one colour with white stays ≥ 63 away from every
/// blend of another colour with white.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Color {
    /// (220, 30, 30)
    Red,
    /// (30, 160, 50)
    Green,
    /// (0, 90, 230)
    Blue,
    /// (240, 200, 20)
    Yellow,
    /// (160, 30, 200)
    Purple,
}

impl Color {
    /// Every colour, in prompt-sampling order.
    pub const ALL: [Color; 5] =
        [Color::Red, Color::Green, Color::Blue, Color::Yellow, Color::Purple];

    /// The word in prompts.
    pub fn name(self) -> &'static str {
        match self {
            Color::Red => "red",
            Color::Green => "green",
            Color::Blue => "blue",
            Color::Yellow => "yellow",
            Color::Purple => "purple",
        }
    }

    /// The colour a word names.
    pub fn from_name(word: &str) -> Option<Color> {
        Color::ALL.into_iter().find(|c| c.name() == word)
    }

    /// The drawing colour.
    pub fn rgb(self) -> Rgb<u8> {
        Rgb(match self {
            Color::Red => [220, 30, 30],
            Color::Green => [30, 160, 50],
            Color::Blue => [0, 90, 230],
            Color::Yellow => [240, 200, 20],
            Color::Purple => [160, 30, 200],
        })
    }
}

impl fmt::Display for Color {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The colour a pixel shows, or `None` for background and unrecognised colours.
///
/// Blurry images blend shape colours with the background, so a pixel is matched against the
/// segments from the background to each colour (not against the colours alone): the nearest
/// segment wins if the pixel lies within [`MAX_RESIDUAL`] of it and at least half-way from the
/// background to the colour. Blend fringes thus never read as a third colour, and thresholding at
/// half keeps the outline of a blurred shape where it was.
pub fn classify_pixel(pixel: Rgb<u8>) -> Option<Color> {
    let p = from_background(pixel);
    let mut best = None;
    let mut best_residual2 = MAX_RESIDUAL * MAX_RESIDUAL;
    for color in Color::ALL {
        let d = from_background(color.rgb());
        let (pd, dd) = (dot(p, d), dot(d, d));
        let alpha = (pd / dd).clamp(0.0, 1.0);
        let residual2 = dot(p, p) - 2.0 * alpha * pd + alpha * alpha * dd;
        if residual2 <= best_residual2 {
            (best, best_residual2) = (Some((color, alpha)), residual2);
        }
    }
    best.filter(|&(_, alpha)| alpha >= 0.5).map(|(color, _)| color)
}

/// `rgb` − [`BACKGROUND`].
fn from_background(rgb: Rgb<u8>) -> [f64; 3] {
    let [r, g, b] = rgb.0.map(f64::from);
    let [r0, g0, b0] = BACKGROUND.0.map(f64::from);
    [r - r0, g - g0, b - b0]
}

fn dot(a: [f64; 3], b: [f64; 3]) -> f64 {
    a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blend(color: Color, alpha: f64) -> Rgb<u8> {
        let (c, w) = (color.rgb().0, BACKGROUND.0);
        Rgb(std::array::from_fn(|k| {
            (f64::from(w[k]) + alpha * (f64::from(c[k]) - f64::from(w[k]))).round() as u8
        }))
    }

    #[test]
    fn colours_are_far_apart() {
        for a in Color::ALL {
            for b in Color::ALL.into_iter().filter(|&b| b != a) {
                let d: f64 = (0..3)
                    .map(|k| (f64::from(a.rgb().0[k]) - f64::from(b.rgb().0[k])).powi(2))
                    .sum::<f64>()
                    .sqrt();
                assert!(d >= 171.0, "{a} and {b} are only {d:.0} apart");
            }
        }
    }

    #[test]
    fn blends_with_the_background_threshold_at_half() {
        for color in Color::ALL {
            assert_eq!(Color::from_name(color.name()), Some(color));
            for alpha in [0.55, 0.7, 0.85, 1.0] {
                assert_eq!(classify_pixel(blend(color, alpha)), Some(color), "{color} at {alpha}");
            }
            for alpha in [0.0, 0.2, 0.45] {
                assert_eq!(classify_pixel(blend(color, alpha)), None, "{color} at {alpha}");
            }
        }
        assert_eq!(classify_pixel(Rgb([180, 20, 20])), Some(Color::Red), "a darker red");
        assert_eq!(classify_pixel(Rgb([0, 0, 0])), None, "black is no colour");
        assert_eq!(classify_pixel(Rgb([128, 128, 128])), None, "grey is no colour");
    }
}
