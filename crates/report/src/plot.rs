//! A line plot of one or more series over a shared x axis, with ticks, labels and a legend.

use image::Rgb;

use crate::text::{draw_text, text_width};
use crate::RgbImage;

/// One line: its legend label, colour and (x, y) points in x order. Non-finite points are skipped.
#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub colour: [u8; 3],
    pub points: Vec<(f64, f64)>,
}

const MARGIN_LEFT: u32 = 64;
const MARGIN_RIGHT: u32 = 16;
const MARGIN_TOP: u32 = 36;
const MARGIN_BOTTOM: u32 = 40;
const TICKS: usize = 5;

/// Round tick positions covering the values: a step of 1, 2 or 5 × 10^k giving about
/// `TICKS` intervals, and the range widened to whole steps.
fn ticks(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let (lo, hi) =
        values.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    let (lo, hi) = match (lo.is_finite(), hi - lo < 1e-12) {
        (false, _) => (0.0, 1.0),
        (true, true) => (lo - 0.5, hi + 0.5),
        _ => (lo, hi),
    };
    let raw = (hi - lo) / (TICKS - 1) as f64;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = magnitude
        * match raw / magnitude {
            n if n < 1.5 => 1.0,
            n if n < 3.0 => 2.0,
            n if n < 7.0 => 5.0,
            _ => 10.0,
        };
    let first = (lo / step).floor() as i64;
    let last = (hi / step).ceil() as i64;
    (first..=last).map(|i| i as f64 * step).collect()
}

/// A tick label with as many decimals as the tick step needs.
fn label(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 { 0 } else { (-step.log10()).ceil() as usize };
    format!("{v:.decimals$}")
}

/// Draws `series` on a `width` × `height` white canvas with `title` above and axis labels.
pub fn line_plot(
    series: &[Series],
    title: &str,
    x_label: &str,
    y_label: &str,
    width: u32,
    height: u32,
) -> RgbImage {
    let mut img = RgbImage::from_pixel(width, height, Rgb([255, 255, 255]));
    let finite = |s: &Series| {
        s.points.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite()).collect::<Vec<_>>()
    };
    let all: Vec<(f64, f64)> = series.iter().flat_map(finite).collect();
    let x_ticks = ticks(all.iter().map(|p| p.0));
    let y_ticks = ticks(all.iter().map(|p| p.1));
    let (x0, x1) = (x_ticks[0], *x_ticks.last().expect("ticks"));
    let (y0, y1) = (y_ticks[0], *y_ticks.last().expect("ticks"));
    let (left, top) = (MARGIN_LEFT as f64, MARGIN_TOP as f64);
    let plot_w = (width - MARGIN_LEFT - MARGIN_RIGHT) as f64;
    let plot_h = (height - MARGIN_TOP - MARGIN_BOTTOM) as f64;
    let to_px = |x: f64, y: f64| {
        (left + (x - x0) / (x1 - x0) * plot_w, top + (1.0 - (y - y0) / (y1 - y0)) * plot_h)
    };
    let grey = Rgb([200, 200, 200]);
    let black = Rgb([0, 0, 0]);
    for &yv in &y_ticks {
        let (_, py) = to_px(x0, yv);
        line(&mut img, (left, py), (left + plot_w, py), grey);
        let text = label(yv, y_ticks[1] - y_ticks[0]);
        let tx = MARGIN_LEFT as i64 - 4 - text_width(&text, 1) as i64;
        draw_text(&mut img, tx, py as i64 - 4, &text, black, 1);
    }
    for &xv in &x_ticks {
        let (px, _) = to_px(xv, y0);
        line(&mut img, (px, top), (px, top + plot_h), grey);
        let text = label(xv, x_ticks[1] - x_ticks[0]);
        let tx = px as i64 - text_width(&text, 1) as i64 / 2;
        draw_text(&mut img, tx, (top + plot_h) as i64 + 6, &text, black, 1);
    }
    line(&mut img, (left, top), (left, top + plot_h), black);
    line(&mut img, (left, top + plot_h), (left + plot_w, top + plot_h), black);
    for s in series {
        let points = finite(s);
        let colour = Rgb(s.colour);
        for pair in points.windows(2) {
            let (a, b) = (to_px(pair[0].0, pair[0].1), to_px(pair[1].0, pair[1].1));
            thick_line(&mut img, a, b, colour);
        }
        for &(x, y) in &points {
            let (px, py) = to_px(x, y);
            dot(&mut img, px, py, colour);
        }
    }
    let title_x = (width as i64 - text_width(title, 2) as i64) / 2;
    draw_text(&mut img, title_x, 8, title, black, 2);
    let x_label_x = left as i64 + (plot_w as i64 - text_width(x_label, 1) as i64) / 2;
    draw_text(&mut img, x_label_x, height as i64 - 14, x_label, black, 1);
    draw_text(&mut img, 4, MARGIN_TOP as i64 - 12, y_label, black, 1);
    // Legend, top-left inside the plot.
    for (i, s) in series.iter().enumerate() {
        let y = top as i64 + 6 + 12 * i as i64;
        let x = left as i64 + 8;
        for dx in 0..14 {
            for dy in 3..5 {
                put(&mut img, (x + dx) as f64, (y + dy) as f64, Rgb(s.colour));
            }
        }
        draw_text(&mut img, x + 18, y, &s.label, black, 1);
    }
    img
}

fn put(img: &mut RgbImage, x: f64, y: f64, colour: Rgb<u8>) {
    let (x, y) = (x.round(), y.round());
    if x >= 0.0 && y >= 0.0 && (x as u32) < img.width() && (y as u32) < img.height() {
        img.put_pixel(x as u32, y as u32, colour);
    }
}

fn line(img: &mut RgbImage, a: (f64, f64), b: (f64, f64), colour: Rgb<u8>) {
    let steps = (b.0 - a.0).abs().max((b.1 - a.1).abs()).ceil().max(1.0) as usize;
    for i in 0..=steps {
        let f = i as f64 / steps as f64;
        put(img, a.0 + f * (b.0 - a.0), a.1 + f * (b.1 - a.1), colour);
    }
}

fn thick_line(img: &mut RgbImage, a: (f64, f64), b: (f64, f64), colour: Rgb<u8>) {
    for (dx, dy) in [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0)] {
        line(img, (a.0 + dx, a.1 + dy), (b.0 + dx, b.1 + dy), colour);
    }
}

fn dot(img: &mut RgbImage, x: f64, y: f64, colour: Rgb<u8>) {
    for dx in -2..=2 {
        for dy in -2..=2 {
            put(img, x + dx as f64, y + dy as f64, colour);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_values() {
        assert_eq!(ticks([0.0, 70.0].into_iter()), [0.0, 20.0, 40.0, 60.0, 80.0]);
        let t = ticks([0.03, 0.49].into_iter());
        assert_eq!(t.len(), 6);
        assert!((t[0] - 0.0).abs() < 1e-12 && (t[5] - 0.5).abs() < 1e-12, "{t:?}");
        assert_eq!(label(0.30000000000000004, 0.1), "0.3");
        assert_eq!(label(40.0, 20.0), "40");
    }

    #[test]
    fn a_rising_series_goes_from_bottom_left_to_top_right() {
        let s = Series {
            label: "reward".into(),
            colour: [200, 0, 0],
            points: vec![(0.0, 0.1), (1.0, f64::NAN), (2.0, 0.5), (4.0, 0.9)],
        };
        let img = line_plot(&[s], "reward", "step", "mean", 320, 200);
        assert_eq!(img.dimensions(), (320, 200));
        let red: Vec<(u32, u32)> = img
            .enumerate_pixels()
            .filter(|(_, _, p)| **p == Rgb([200, 0, 0]))
            .map(|(x, y, _)| (x, y))
            .collect();
        // Skip the legend swatch (top-left); the curve's ends are at the plot's corners.
        let curve: Vec<_> = red.iter().filter(|(x, _)| *x > MARGIN_LEFT + 30).collect();
        let leftmost = curve.iter().min_by_key(|p| p.0).unwrap();
        let rightmost = curve.iter().max_by_key(|p| p.0).unwrap();
        assert!(leftmost.1 > rightmost.1 + 80, "{leftmost:?} {rightmost:?}");
        assert!(rightmost.0 >= 280, "{rightmost:?}");
    }
}
