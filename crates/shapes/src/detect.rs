//! The object detector: palette pixels → connected components → shapes.

use std::cmp::Ordering;
use std::f64::consts::{FRAC_PI_4, SQRT_2};

use image::RgbImage;

use crate::{classify_pixel, Color, Shape};

/// Components smaller than this fraction of the image are noise (10 px at 32², 41 px at 64²).
pub const MIN_AREA_FRACTION: f64 = 0.01;
/// Components whose bounding box is more elongated than this (either way) are no shape.
pub const MAX_ASPECT: f64 = 1.5;
/// Components farther than this from every shape's prototype (see [`detect`]) are no shape.
pub const MAX_SHAPE_DISTANCE: f64 = 0.4;
/// The weights of fill, taper and diagonal extent in the distance to a prototype.
const WEIGHTS: [f64; 3] = [1.0, 1.0, 2.0];

/// One object found in an image.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Detection {
    pub shape: Shape,
    pub color: Color,
    /// The mean of the pixel centres, as fractions of the width and height (y down).
    pub centroid: (f64, f64),
    /// Pixels.
    pub area: u32,
    /// `[x0, y0, x1, y1]` in pixels, the ends exclusive.
    pub bbox: [u32; 4],
}

/// The objects in `image`, in the raster order of their first pixels.
///
/// Pixels are classified with [`classify_pixel`]; 4-connected pixels of one colour form a
/// component, and components under [`MIN_AREA_FRACTION`] are dropped. A component whose bounding
/// box has an aspect ratio within [`MAX_ASPECT`] is the shape whose prototype is nearest in three
/// features (Euclidean, the diagonal weighted twice), if within [`MAX_SHAPE_DISTANCE`]:
///
/// | feature                                                    | square | circle | triangle |
/// |------------------------------------------------------------|--------|--------|----------|
/// | fill: area / bounding-box area                             | 1      | π/4    | 1/2      |
/// | taper: 1 − pixels above the box's middle / pixels below it | 0      | 0      | 2/3      |
/// | diagonal: extent along the diagonals / along the axes      | √2     | 1      | 3/(2√2)  |
///
/// Extents are between pixel centres, averaged over both axes and both diagonals. The diagonal
/// tells squares from circles even at 10 px, where pixel staircases make a small circle's fill
/// close to a square's; the taper tells triangles (pointing up) from circles under blur.
pub fn detect(image: &RgbImage) -> Vec<Detection> {
    let (w, h) = (image.width() as usize, image.height() as usize);
    let labels: Vec<Option<Color>> = image.pixels().map(|p| classify_pixel(*p)).collect();
    let min_area = MIN_AREA_FRACTION * (w * h) as f64;
    let mut seen = vec![false; w * h];
    let (mut detections, mut stack, mut points) = (vec![], vec![], vec![]);
    for start in 0..w * h {
        let Some(color) = labels[start].filter(|_| !seen[start]) else { continue };
        seen[start] = true;
        stack.push(start);
        points.clear();
        while let Some(i) = stack.pop() {
            let (x, y) = (i % w, i / w);
            points.push((x, y));
            let neighbours = [
                (x > 0).then(|| i - 1),
                (x + 1 < w).then(|| i + 1),
                (y > 0).then(|| i - w),
                (y + 1 < h).then(|| i + w),
            ];
            for j in neighbours.into_iter().flatten() {
                if !seen[j] && labels[j] == Some(color) {
                    seen[j] = true;
                    stack.push(j);
                }
            }
        }
        if points.len() as f64 >= min_area {
            detections.extend(measure(&points, color, (w, h)));
        }
    }
    detections
}

/// The detection a component makes, if its geometry is a shape's.
fn measure(points: &[(usize, usize)], color: Color, (w, h): (usize, usize)) -> Option<Detection> {
    let geometry = Geometry::of(points);
    let [x0, y0, x1, y1] = geometry.bbox;
    if !(1.0 / MAX_ASPECT..=MAX_ASPECT).contains(&((x1 - x0) as f64 / (y1 - y0) as f64)) {
        return None;
    }
    let distance = |shape: Shape| {
        let ideal = prototype(shape);
        (0..3).map(|k| (WEIGHTS[k] * (ideal[k] - geometry.features[k])).powi(2)).sum::<f64>().sqrt()
    };
    let shape = Shape::ALL.into_iter().min_by(|&a, &b| distance(a).total_cmp(&distance(b)))?;
    (distance(shape) <= MAX_SHAPE_DISTANCE).then(|| Detection {
        shape,
        color,
        centroid: (geometry.centroid.0 / w as f64, geometry.centroid.1 / h as f64),
        area: points.len() as u32,
        bbox: geometry.bbox.map(|v| v as u32),
    })
}

/// What a component's pixels measure.
struct Geometry {
    /// `[x0, y0, x1, y1]`, the ends exclusive.
    bbox: [usize; 4],
    /// The mean pixel centre, in pixels.
    centroid: (f64, f64),
    /// `[fill, taper, diagonal]`, see [`detect`].
    features: [f64; 3],
}

impl Geometry {
    fn of(points: &[(usize, usize)]) -> Self {
        let extent = |f: &dyn Fn(f64, f64) -> f64| {
            let values = points.iter().map(|&(x, y)| f(x as f64, y as f64));
            let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
            (lo, hi - lo)
        };
        let ((x0, dx), (y0, dy)) = (extent(&|x, _| x), extent(&|_, y| y));
        let diagonal = (extent(&|x, y| x + y).1 + extent(&|x, y| x - y).1) / 2.0;
        let (bw, bh) = (dx + 1.0, dy + 1.0);
        let area = points.len() as f64;
        // Pixels above and below the box's middle (a middle row counts half to each).
        let (mut above, mut below) = (0.0, 0.0);
        for &(_, y) in points {
            match (y as f64 + 0.5 - y0).total_cmp(&(bh / 2.0)) {
                Ordering::Less => above += 1.0,
                Ordering::Greater => below += 1.0,
                Ordering::Equal => (above, below) = (above + 0.5, below + 0.5),
            }
        }
        let mean = |f: fn(&(usize, usize)) -> usize| {
            points.iter().map(|p| f(p) as f64 + 0.5).sum::<f64>() / area
        };
        Geometry {
            bbox: [x0, y0, x0 + bw, y0 + bh].map(|v| v as usize),
            centroid: (mean(|p| p.0), mean(|p| p.1)),
            features: [
                area / (bw * bh),
                1.0 - above / below,
                diagonal / SQRT_2 / ((dx + dy) / 2.0),
            ],
        }
    }
}

/// A shape's ideal features: fill, taper and diagonal (see [`detect`]).
fn prototype(shape: Shape) -> [f64; 3] {
    match shape {
        Shape::Square => [1.0, 0.0, SQRT_2],
        Shape::Circle => [FRAC_PI_4, 0.0, 1.0],
        Shape::Triangle => [0.5, 2.0 / 3.0, 1.5 / SQRT_2],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BACKGROUND;

    /// A 32 × 32 image with `color` where `inside(x, y)` holds for the pixel centre.
    fn paint(image: &mut RgbImage, color: Color, inside: impl Fn(f64, f64) -> bool) {
        for (x, y, pixel) in image.enumerate_pixels_mut() {
            if inside(f64::from(x) + 0.5, f64::from(y) + 0.5) {
                *pixel = color.rgb();
            }
        }
    }

    #[test]
    fn finds_each_shape_with_its_colour_place_and_box() {
        let mut image = RgbImage::from_pixel(32, 32, BACKGROUND);
        paint(&mut image, Color::Green, |x, y| {
            (3.0..14.0).contains(&x) && (3.0..14.0).contains(&y)
        });
        paint(&mut image, Color::Red, |x, y| (x - 24.0).hypot(y - 8.0) <= 6.0);
        paint(&mut image, Color::Blue, |x, y| y <= 30.0 && (x - 10.0).abs() <= (y - 18.0) / 2.0);
        let detections = detect(&image);
        let found: Vec<(Shape, Color)> = detections.iter().map(|d| (d.shape, d.color)).collect();
        assert_eq!(
            found,
            [
                (Shape::Circle, Color::Red),
                (Shape::Square, Color::Green),
                (Shape::Triangle, Color::Blue)
            ]
        );
        let square = detections[1];
        assert_eq!(
            (square.area, square.bbox, square.centroid),
            (121, [3, 3, 14, 14], (8.5 / 32.0, 8.5 / 32.0))
        );
        assert!(detections[2].centroid.1 > 25.0 / 32.0, "a triangle's centroid is low in its box");
    }

    #[test]
    fn specks_bars_and_upside_down_triangles_are_no_shapes() {
        let mut image = RgbImage::from_pixel(32, 32, BACKGROUND);
        paint(&mut image, Color::Red, |x, y| x < 3.0 && y < 3.0);
        paint(&mut image, Color::Blue, |x, y| x > 8.0 && y > 28.0);
        paint(&mut image, Color::Green, |x, y| y >= 5.0 && (x - 20.0).abs() <= (17.0 - y) / 2.0);
        assert_eq!(detect(&image), []);
    }
}
