//! Plane geometry for text boxes: the border points of each blob and hole of a bitmap
//! (what OpenCV's `findContours(RETR_LIST)` traces), convex hulls, minimum-area rectangles, and
//! Clipper's round-joined polygon offset.

use std::collections::VecDeque;

pub type Point = [f64; 2];

/// The border points of every 8-connected blob of set pixels, and of every hole inside a blob
/// (4-connected unset pixels away from the image edge): one point list per contour, blobs in raster
/// order of their first pixel, then holes.
pub fn contours(bitmap: &[bool], width: usize, height: usize) -> Vec<Vec<Point>> {
    let set = |x: i64, y: i64| {
        x >= 0 && y >= 0 && (x as usize) < width && (y as usize) < height && {
            bitmap[y as usize * width + x as usize]
        }
    };
    const FOUR: [(i64, i64); 4] = [(1, 0), (-1, 0), (0, 1), (0, -1)];
    const EIGHT: [(i64, i64); 8] =
        [(1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (1, -1), (-1, 1), (-1, -1)];
    let mut label = vec![0u32; width * height];
    let mut out = vec![];
    // Flood-fills from `start` over pixels whose set-ness is `on`, returning the region.
    let fill = |start: usize, on: bool, steps: &[(i64, i64)], label: &mut Vec<u32>, id: u32| {
        let mut region = vec![start];
        let mut queue = VecDeque::from([start]);
        label[start] = id;
        while let Some(i) = queue.pop_front() {
            let (x, y) = ((i % width) as i64, (i / width) as i64);
            for (dx, dy) in steps {
                let (nx, ny) = (x + dx, y + dy);
                if nx < 0 || ny < 0 || nx as usize >= width || ny as usize >= height {
                    continue;
                }
                let j = ny as usize * width + nx as usize;
                if label[j] == 0 && bitmap[j] == on {
                    label[j] = id;
                    region.push(j);
                    queue.push_back(j);
                }
            }
        }
        region
    };
    let mut holes = vec![];
    let mut next = 1;
    for start in 0..width * height {
        if label[start] != 0 {
            continue;
        }
        let on = bitmap[start];
        let region = fill(start, on, if on { &EIGHT } else { &FOUR }, &mut label, next);
        next += 1;
        let xy = |i: usize| ((i % width) as i64, (i / width) as i64);
        if on {
            let border = region
                .iter()
                .map(|&i| xy(i))
                .filter(|&(x, y)| FOUR.iter().any(|(dx, dy)| !set(x + dx, y + dy)))
                .map(|(x, y)| [x as f64, y as f64])
                .collect();
            out.push(border);
        } else {
            let touches_edge = region.iter().map(|&i| xy(i)).any(|(x, y)| {
                x == 0 || y == 0 || x as usize == width - 1 || y as usize == height - 1
            });
            if !touches_edge {
                let mut border: Vec<(i64, i64)> = region
                    .iter()
                    .flat_map(|&i| {
                        let (x, y) = xy(i);
                        FOUR.iter().map(move |(dx, dy)| (x + dx, y + dy))
                    })
                    .filter(|&(x, y)| set(x, y))
                    .collect();
                border.sort_unstable();
                border.dedup();
                holes.push(border.into_iter().map(|(x, y)| [x as f64, y as f64]).collect());
            }
        }
    }
    out.extend(holes);
    out
}

/// The convex hull, counter-clockwise (y up), without collinear points (Andrew's monotone chain).
pub fn convex_hull(points: &[Point]) -> Vec<Point> {
    let mut p = points.to_vec();
    p.sort_by(|a, b| a[0].total_cmp(&b[0]).then(a[1].total_cmp(&b[1])));
    p.dedup();
    if p.len() < 3 {
        return p;
    }
    let cross = |o: Point, a: Point, b: Point| {
        (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])
    };
    let mut hull: Vec<Point> = Vec::with_capacity(2 * p.len());
    for pass in [p.clone(), p.iter().rev().copied().collect()] {
        let base = hull.len();
        for q in pass {
            while hull.len() >= base + 2
                && cross(hull[hull.len() - 2], hull[hull.len() - 1], q) <= 0.0
            {
                hull.pop();
            }
            hull.push(q);
        }
        hull.pop();
    }
    hull
}

/// A rotated rectangle: its 4 corners in order around it, and its two side lengths.
#[derive(Debug, Clone, PartialEq)]
pub struct Rect {
    pub corners: [Point; 4],
    pub sides: [f64; 2],
}

/// The rectangle of least area around `points` (rotating calipers over the hull's edges).
pub fn min_area_rect(points: &[Point]) -> Rect {
    let hull = convex_hull(points);
    let n = hull.len();
    if n == 0 {
        return Rect { corners: [[0.0; 2]; 4], sides: [0.0; 2] };
    }
    let mut best: Option<(f64, Rect)> = None;
    for i in 0..n.max(1) {
        let (a, b) = (hull[i], hull[(i + 1) % n]);
        let (dx, dy) = (b[0] - a[0], b[1] - a[1]);
        let len = dx.hypot(dy);
        let (u, v) = if len > 0.0 {
            ([dx / len, dy / len], [-dy / len, dx / len])
        } else {
            ([1.0, 0.0], [0.0, 1.0])
        };
        let project = |d: Point| {
            hull.iter()
                .map(|p| p[0] * d[0] + p[1] * d[1])
                .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)))
        };
        let ((u0, u1), (v0, v1)) = (project(u), project(v));
        let area = (u1 - u0) * (v1 - v0);
        if best.as_ref().is_none_or(|(best_area, _)| area < *best_area - 1e-9) {
            let at = |s: f64, t: f64| [s * u[0] + t * v[0], s * u[1] + t * v[1]];
            let corners = [at(u0, v0), at(u1, v0), at(u1, v1), at(u0, v1)];
            best = Some((area, Rect { corners, sides: [u1 - u0, v1 - v0] }));
        }
    }
    best.map(|(_, r)| r).expect("a non-empty hull has a rectangle")
}

/// Shoelace area (positive counter-clockwise with y up) and perimeter of a closed polygon.
pub fn area_and_perimeter(polygon: &[Point]) -> (f64, f64) {
    let n = polygon.len();
    (0..n).fold((0.0, 0.0), |(area, length), i| {
        let (a, b) = (polygon[i], polygon[(i + 1) % n]);
        (area + (a[0] * b[1] - b[0] * a[1]) / 2.0, length + (b[0] - a[0]).hypot(b[1] - a[1]))
    })
}

/// The points of a convex polygon grown by `delta` with round corners, as Clipper's
/// `ClipperOffset(JT_ROUND, ET_CLOSEDPOLYGON)` makes them: input truncated to integers, arcs in
/// steps that keep within 0.25 of the circle, output rounded to integers.
pub fn offset_round(polygon: &[Point], delta: f64) -> Vec<Point> {
    let mut p: Vec<Point> = polygon.iter().map(|q| [q[0].trunc(), q[1].trunc()]).collect();
    p.dedup();
    if p.len() > 1 && p.first() == p.last() {
        p.pop();
    }
    if area_and_perimeter(&p).0 < 0.0 {
        p.reverse();
    }
    let n = p.len();
    let round = |v: f64| if v < 0.0 { (v - 0.5).trunc() } else { (v + 0.5).trunc() };
    let push = |out: &mut Vec<Point>, q: Point, d: [f64; 2]| {
        out.push([round(q[0] + d[0] * delta), round(q[1] + d[1] * delta)])
    };
    if n < 3 {
        // A point or a segment grows to a disc or a stadium: its arcs' extremes suffice here.
        let mut out = vec![];
        for q in &p {
            for k in 0..16 {
                let t = k as f64 * std::f64::consts::PI / 8.0;
                push(&mut out, *q, [t.cos(), t.sin()]);
            }
        }
        return out;
    }
    let normal = |a: Point, b: Point| {
        let (dx, dy) = (b[0] - a[0], b[1] - a[1]);
        let f = 1.0 / dx.hypot(dy);
        [dy * f, -dx * f]
    };
    let normals: Vec<[f64; 2]> = (0..n).map(|i| normal(p[i], p[(i + 1) % n])).collect();
    let steps = std::f64::consts::PI / (1.0 - 0.25 / delta.abs()).acos();
    let steps = steps.min(delta.abs() * std::f64::consts::PI);
    let (sin, cos) = (2.0 * std::f64::consts::PI / steps).sin_cos();
    let per_radian = steps / (2.0 * std::f64::consts::PI);
    let mut out = vec![];
    for j in 0..n {
        let k = (j + n - 1) % n;
        let (nk, nj) = (normals[k], normals[j]);
        let sin_a = nk[0] * nj[1] - nj[0] * nk[1];
        let cos_a = nk[0] * nj[0] + nk[1] * nj[1];
        if (sin_a * delta).abs() < 1.0 && cos_a > 0.0 {
            push(&mut out, p[j], nk);
            continue;
        }
        let sin_a = sin_a.clamp(-1.0, 1.0);
        if sin_a * delta < 0.0 {
            push(&mut out, p[j], nk);
            out.push(p[j]);
            push(&mut out, p[j], nj);
            continue;
        }
        let a = sin_a.atan2(cos_a);
        let count = ((per_radian * a.abs()).round() as usize).max(1);
        let [mut x, mut y] = nk;
        for _ in 0..count {
            push(&mut out, p[j], [x, y]);
            (x, y) = (x * cos - sin * y, x * sin + y * cos);
        }
        push(&mut out, p[j], nj);
    }
    out
}

/// Whether `q` lies inside the polygon or on its boundary.
pub fn covers(polygon: &[Point], q: Point) -> bool {
    let n = polygon.len();
    let mut inside = false;
    for i in 0..n {
        let (a, b) = (polygon[i], polygon[(i + 1) % n]);
        let cross = (b[0] - a[0]) * (q[1] - a[1]) - (b[1] - a[1]) * (q[0] - a[0]);
        let within = (q[0] - a[0]) * (q[0] - b[0]) <= 0.0 && (q[1] - a[1]) * (q[1] - b[1]) <= 0.0;
        if cross.abs() < 1e-9 && within {
            return true;
        }
        if (a[1] > q[1]) != (b[1] > q[1])
            && q[0] < a[0] + (q[1] - a[1]) * (b[0] - a[0]) / (b[1] - a[1])
        {
            inside = !inside;
        }
    }
    inside
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_with_a_hole_has_two_contours() {
        // A 5 × 5 ring of set pixels around one unset pixel, in a 7 × 7 image.
        let (w, h) = (7, 7);
        let bitmap: Vec<bool> = (0..w * h)
            .map(|i| {
                let (x, y) = (i % w, i / w);
                (1..6).contains(&x) && (1..6).contains(&y) && !(x == 3 && y == 3)
            })
            .collect();
        let c = contours(&bitmap, w, h);
        assert_eq!(c.len(), 2);
        let outer = min_area_rect(&c[0]);
        assert_eq!(outer.sides, [4.0, 4.0]);
        // The hole's border is the diamond of its four neighbours.
        let hole = min_area_rect(&c[1]);
        assert!(hole.sides.iter().all(|s| (s - 2f64.sqrt()).abs() < 1e-12), "{hole:?}");
    }

    #[test]
    fn the_min_area_rect_of_a_tilted_bar_follows_the_bar() {
        let points: Vec<Point> = (0..20)
            .flat_map(|i| [[i as f64, i as f64 * 0.5], [i as f64, i as f64 * 0.5 + 3.0]])
            .collect();
        let r = min_area_rect(&points);
        let long = r.sides[0].max(r.sides[1]);
        let short = r.sides[0].min(r.sides[1]);
        // Along (2, 1)/√5 the bar spans 0 … (38 + 12.5)/√5; across it, 3 · 2/√5.
        assert!((long - 50.5 / 5f64.sqrt()).abs() < 1e-9, "{r:?}");
        assert!((short - 6.0 / 5f64.sqrt()).abs() < 1e-9, "{r:?}");
    }

    #[test]
    fn offsetting_a_rectangle_grows_each_side_by_delta() {
        let square = [[10.0, 10.0], [30.0, 10.0], [30.0, 20.0], [10.0, 20.0]];
        let grown = offset_round(&square, 4.0);
        let r = min_area_rect(&grown);
        let mut sides = r.sides;
        sides.sort_by(f64::total_cmp);
        assert_eq!(sides, [18.0, 28.0]);
        let (area, length) = area_and_perimeter(&square);
        assert_eq!((area.abs(), length), (200.0, 60.0));
    }

    #[test]
    fn covers_counts_the_boundary() {
        let square = [[0.0, 0.0], [4.0, 0.0], [4.0, 4.0], [0.0, 4.0]];
        assert!(
            covers(&square, [2.0, 2.0])
                && covers(&square, [4.0, 2.0])
                && covers(&square, [0.0, 0.0])
        );
        assert!(!covers(&square, [4.5, 2.0]) && !covers(&square, [-0.1, 0.0]));
    }
}
