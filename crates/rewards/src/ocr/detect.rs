//! Text detection: the DB (differentiable binarisation) model's input, and the post-processing
//! that turns its probability map into text boxes — threshold, 2 × 2 dilation, one contour per
//! blob, minimum-area rectangles, the mean-probability box score, unclip, and reading order.

use super::geometry::{area_and_perimeter, contours, covers, min_area_rect, offset_round, Point};
use super::picture::Picture;

/// A text box in picture pixels: top-left, top-right, bottom-right, bottom-left.
pub type TextBox = [[f64; 2]; 4];

/// The settings of rapidocr's default detector.
#[derive(Debug, Clone, Copy)]
pub struct DetectSettings {
    /// The shorter side is scaled up to this length (then both rounded to multiples of 32).
    pub min_side: usize,
    /// Probability above which a pixel is text.
    pub threshold: f32,
    /// Mean probability a box needs.
    pub box_threshold: f64,
    /// How far a box grows: its area × this / its perimeter.
    pub unclip_ratio: f64,
    /// At most this many contours are looked at.
    pub max_candidates: usize,
}

impl Default for DetectSettings {
    fn default() -> Self {
        Self {
            min_side: 736,
            threshold: 0.3,
            box_threshold: 0.5,
            unclip_ratio: 1.6,
            max_candidates: 1000,
        }
    }
}

/// Python's `round` (halves to even), which the reference uses for sizes and coordinates.
pub fn round_half_even(x: f64) -> f64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
        r - x.signum()
    } else {
        r
    }
}

/// `h × ratio`, `w × ratio` truncated, then rounded to multiples of 32.
pub fn scaled_to_32(width: usize, height: usize, ratio: f64) -> (usize, usize) {
    let side = |n: usize| (round_half_even((n as f64 * ratio).trunc() / 32.0) * 32.0) as usize;
    (side(width), side(height))
}

/// The detector's input for `picture`: scaled so its shorter side is at least `min_side`,
/// normalised to [−1, 1], as NCHW. `None` for a picture too small to scale.
pub fn input(picture: &Picture, min_side: usize) -> Option<([usize; 4], Vec<f32>)> {
    let (w, h) = (picture.width, picture.height);
    let short = w.min(h);
    let ratio = if short < min_side { min_side as f64 / short as f64 } else { 1.0 };
    let (rw, rh) = scaled_to_32(w, h, ratio);
    if rw == 0 || rh == 0 {
        return None;
    }
    Some(([1, 3, rh, rw], planar_normalised(&picture.resize(rw, rh))))
}

/// The picture as 3 planes of `x / 255 − 0.5) / 0.5`.
pub fn planar_normalised(picture: &Picture) -> Vec<f32> {
    let n = picture.width * picture.height;
    let mut out = vec![0.0; 3 * n];
    for (i, px) in picture.data.chunks_exact(3).enumerate() {
        for c in 0..3 {
            out[c * n + i] = (px[c] as f32 / 255.0 - 0.5) / 0.5;
        }
    }
    out
}

/// The text boxes of a `width` × `height` probability map, in the coordinates of a
/// `dest_width` × `dest_height` picture, in reading order.
pub fn boxes(
    probability: &[f32],
    width: usize,
    height: usize,
    dest_width: usize,
    dest_height: usize,
    settings: &DetectSettings,
) -> Vec<TextBox> {
    let text: Vec<bool> = probability.iter().map(|&p| p > settings.threshold).collect();
    // A 2 × 2 dilation: a pixel is set when it or its left, upper or upper-left neighbour is.
    let dilated: Vec<bool> = (0..width * height)
        .map(|i| {
            let (x, y) = (i % width, i / width);
            text[i]
                || (x > 0 && text[i - 1])
                || (y > 0 && text[i - width])
                || (x > 0 && y > 0 && text[i - width - 1])
        })
        .collect();
    let mut found = vec![];
    for contour in contours(&dilated, width, height).into_iter().take(settings.max_candidates) {
        let (rect, short) = mini_box(&contour);
        if short < 3.0 {
            continue;
        }
        if box_score(probability, width, height, &rect) < settings.box_threshold {
            continue;
        }
        let (area, perimeter) = area_and_perimeter(&rect);
        let grown = offset_round(&rect, area.abs() * settings.unclip_ratio / perimeter);
        let (rect, short) = mini_box(&grown);
        if short < 5.0 {
            continue;
        }
        let scale = |v: f64, from: usize, to: usize| {
            round_half_even(v / from as f64 * to as f64).clamp(0.0, to as f64)
        };
        let scaled =
            rect.map(|[x, y]| [scale(x, width, dest_width), scale(y, height, dest_height)]);
        let mut ordered = clockwise(scaled);
        for p in &mut ordered {
            p[0] = p[0].clamp(0.0, dest_width as f64 - 1.0).trunc();
            p[1] = p[1].clamp(0.0, dest_height as f64 - 1.0).trunc();
        }
        let side = |a: [f64; 2], b: [f64; 2]| (a[0] - b[0]).hypot(a[1] - b[1]).trunc();
        if side(ordered[0], ordered[1]) <= 3.0 || side(ordered[0], ordered[3]) <= 3.0 {
            continue;
        }
        found.push(ordered);
    }
    reading_order(found)
}

/// The minimum-area rectangle of `points` as (left pair top first, right pair bottom first) and
/// its shorter side, in the corner order the reference's `get_mini_boxes` gives.
fn mini_box(points: &[Point]) -> (TextBox, f64) {
    let rect = min_area_rect(points);
    let mut p = rect.corners;
    p.sort_by(|a, b| a[0].total_cmp(&b[0]));
    let (i1, i4) = if p[1][1] > p[0][1] { (0, 1) } else { (1, 0) };
    let (i2, i3) = if p[3][1] > p[2][1] { (2, 3) } else { (3, 2) };
    ([p[i1], p[i2], p[i3], p[i4]], rect.sides[0].min(rect.sides[1]))
}

/// The mean probability inside the box (drawn with integer corners in its bounding window).
fn box_score(probability: &[f32], width: usize, height: usize, rect: &TextBox) -> f64 {
    let lo_hi = |axis: usize, limit: usize| {
        let (lo, hi) = rect
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), p| (lo.min(p[axis]), hi.max(p[axis])));
        let clip = |v: f64| (v as i64).clamp(0, limit as i64 - 1) as usize;
        (clip(lo.floor()), clip(hi.ceil()))
    };
    let ((x0, x1), (y0, y1)) = (lo_hi(0, width), lo_hi(1, height));
    let local: Vec<Point> =
        rect.iter().map(|p| [(p[0] - x0 as f64).trunc(), (p[1] - y0 as f64).trunc()]).collect();
    let (mut sum, mut count) = (0.0, 0usize);
    for y in y0..=y1 {
        for x in x0..=x1 {
            if covers(&local, [(x - x0) as f64, (y - y0) as f64]) {
                sum += probability[y * width + x] as f64;
                count += 1;
            }
        }
    }
    if count == 0 {
        0.0
    } else {
        sum / count as f64
    }
}

/// Top-left, top-right, bottom-right, bottom-left: the two leftmost points top first, then the
/// two rightmost top first.
fn clockwise(points: TextBox) -> TextBox {
    let mut p = points;
    p.sort_by(|a, b| a[0].total_cmp(&b[0]));
    let by_y = |a: &[f64; 2], b: &[f64; 2]| a[1].total_cmp(&b[1]);
    let (mut left, mut right) = ([p[0], p[1]], [p[2], p[3]]);
    left.sort_by(by_y);
    right.sort_by(by_y);
    [left[0], right[0], right[1], left[1]]
}

/// Top to bottom by the first corner; boxes whose tops are within 10 px of the previous one form
/// a line, read left to right.
fn reading_order(mut boxes: Vec<TextBox>) -> Vec<TextBox> {
    boxes.sort_by(|a, b| a[0][1].total_cmp(&b[0][1]));
    let mut line = 0;
    let mut keyed: Vec<(usize, f64, TextBox)> = Vec::with_capacity(boxes.len());
    for (i, b) in boxes.iter().enumerate() {
        if i > 0 && b[0][1] - boxes[i - 1][0][1] >= 10.0 {
            line += 1;
        }
        keyed.push((line, b[0][0], *b));
    }
    keyed.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    keyed.into_iter().map(|(_, _, b)| b).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_rounding_and_sizes() {
        assert_eq!(
            [0.5, 1.5, 2.5, -0.5, 2.4, 2.6].map(round_half_even),
            [0.0, 2.0, 2.0, -0.0, 2.0, 3.0]
        );
        // 512² → 736²; 320 × 96 → ×7.67: 2453 × 736 → 2464 × 736.
        assert_eq!(scaled_to_32(512, 512, 736.0 / 512.0), (736, 736));
        assert_eq!(scaled_to_32(320, 96, 736.0 / 96.0), (2464, 736));
    }

    #[test]
    fn one_bright_bar_gives_one_grown_box_in_destination_pixels() {
        let (w, h) = (64, 32);
        let mut p = vec![0.0f32; w * h];
        for y in 12..20 {
            for x in 10..50 {
                p[y * w + x] = 0.9;
            }
        }
        let found = boxes(&p, w, h, 128, 64, &DetectSettings::default());
        assert_eq!(found.len(), 1);
        let b = found[0];
        // The dilated blob spans x 10..=50, y 12..=20; unclip grows it by 40·8·1.6/96 ≈ 5.3.
        assert!(b[0][0] < 20.0 && b[1][0] > 100.0 && b[0][1] < 24.0 && b[3][1] > 40.0, "{b:?}");
        assert_eq!(b[0][1], b[1][1], "upright");
        // A dim blob scores under the box threshold.
        let dim: Vec<f32> = p.iter().map(|v| v * 0.5).collect();
        assert!(boxes(&dim, w, h, 128, 64, &DetectSettings::default()).is_empty());
    }

    #[test]
    fn boxes_read_by_lines_then_left_to_right() {
        let at = |x: f64, y: f64| [[x, y], [x + 5.0, y], [x + 5.0, y + 5.0], [x, y + 5.0]];
        let order = reading_order(vec![at(50.0, 3.0), at(0.0, 30.0), at(10.0, 0.0), at(0.0, 8.0)]);
        let firsts: Vec<[f64; 2]> = order.iter().map(|b| b[0]).collect();
        assert_eq!(firsts, [[0.0, 8.0], [10.0, 0.0], [50.0, 3.0], [0.0, 30.0]]);
    }
}
