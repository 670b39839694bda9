//! The procedural renderer: a seeded scene that satisfies a task, rasterised by pixel centres.
//!
//! Coordinates are fractions of the (square) image side. A scene holds exactly the objects the
//! requirements name (`count` of each), in their colour or a uniformly random one. Each object's
//! bounding square has a side drawn from [`size_range`], lies [`MARGIN`] inside the image and
//! [`GAP`] away from every other object's square; a position requirement puts the two centres
//! at least [`RELATION_OFFSET`] apart along its axis and at most half that across it.

use image::RgbImage;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{Color, Requirement, Shape, Task, BACKGROUND};

/// Space kept free at the image border.
pub const MARGIN: f64 = 0.04;
/// Space kept free between the bounding squares of two objects.
pub const GAP: f64 = 0.08;
/// The least distance between the centres of a related pair, along the relation's axis.
pub const RELATION_OFFSET: f64 = 0.3;
/// Centre draws per object before the whole layout is drawn again.
const ATTEMPTS: usize = 100;
/// Layouts drawn before giving up. Sampled tasks need at most a few dozen (4 objects: ≤ 36 in
/// 60 000 tasks); only tasks with more objects or contradicting relations exhaust them.
const LAYOUTS: usize = 10_000;

/// The range of an object's side when `objects` objects share the image.
pub fn size_range(objects: usize) -> (f64, f64) {
    match objects {
        0 | 1 => (0.35, 0.5),
        2 => (0.3, 0.4),
        _ => (0.28, 0.34),
    }
}

/// One object of a scene.
struct Object {
    shape: Shape,
    color: Color,
    /// The requirement it stands for.
    requirement: usize,
    center: (f64, f64),
    size: f64,
}

/// A `resolution`² image of a scene satisfying `task`, the same for the same `seed`.
/// Designed for resolutions of 32 and more; shapes get hard to tell apart below.
///
/// # Panics
/// If the objects find no layout: a hand-made task with more than four objects or with
/// contradicting relations (every sampled or parsed task fits).
pub fn render(task: &Task, seed: u64, resolution: u32) -> RgbImage {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut objects = vec![];
    for (requirement, r) in task.requirements.iter().enumerate() {
        for _ in 0..r.count {
            let color = r.color.unwrap_or_else(|| *Color::ALL.choose(&mut rng).expect("colours"));
            let (center, size) = ((0.5, 0.5), 0.0);
            objects.push(Object { shape: r.shape, color, requirement, center, size });
        }
    }
    assert!(
        place(&mut objects, &task.requirements, &mut rng),
        "cannot lay out {:?}: {} objects found no place in {LAYOUTS} layouts",
        task.prompt,
        objects.len()
    );
    let mut image = RgbImage::from_pixel(resolution, resolution, BACKGROUND);
    for object in &objects {
        draw(&mut image, object);
    }
    image
}

/// Draws sizes and centres until every object fits, at most [`LAYOUTS`] times; whether it did.
fn place(objects: &mut [Object], requirements: &[Requirement], rng: &mut impl Rng) -> bool {
    let (lo, hi) = size_range(objects.len());
    (0..LAYOUTS).any(|_| {
        (0..objects.len()).all(|k| {
            let (placed, rest) = objects.split_at_mut(k);
            let object = &mut rest[0];
            object.size = rng.random_range(lo..hi);
            let (min, max) = (MARGIN + object.size / 2.0, 1.0 - MARGIN - object.size / 2.0);
            (0..ATTEMPTS).any(|_| {
                object.center = (rng.random_range(min..max), rng.random_range(min..max));
                placed.iter().all(|other| compatible(object, other, requirements))
            })
        })
    })
}

/// `a` and `b` keep their gap, and any relation between their requirements holds clearly.
fn compatible(a: &Object, b: &Object, requirements: &[Requirement]) -> bool {
    let reach = (a.size + b.size) / 2.0 + GAP;
    let apart =
        (a.center.0 - b.center.0).abs() >= reach || (a.center.1 - b.center.1).abs() >= reach;
    let related = |x: &Object, y: &Object| match requirements[x.requirement].position {
        Some(p) if p.object == y.requirement => {
            let (along, across) = p.relation.offsets(x.center, y.center);
            along >= RELATION_OFFSET && across.abs() <= along / 2.0
        }
        _ => true,
    };
    apart && related(a, b) && related(b, a)
}

/// How much of its colour a faded picture keeps over the background: below the detector's
/// half-way threshold (see [`classify_pixel`](crate::classify_pixel)), so nothing in it is found.
pub const FADED_STRENGTH: f64 = 0.3;

/// Blends every pixel toward the background, keeping `strength` of its difference from it: a
/// pale, washed-out copy of the picture (a poor scan), where `strength` is below ½ too pale to score.
pub fn fade(image: &mut RgbImage, strength: f64) {
    for pixel in image.pixels_mut() {
        for (value, background) in pixel.0.iter_mut().zip(BACKGROUND.0) {
            let (v, b) = (f64::from(*value), f64::from(background));
            *value = (b + strength * (v - b)).round() as u8;
        }
    }
}

/// Fills the pixels whose centres lie inside the object.
fn draw(image: &mut RgbImage, object: &Object) {
    let side = f64::from(image.width());
    let half = object.size / 2.0;
    let pixels = |c: f64| {
        let first = ((c - half) * side).floor().max(0.0) as u32;
        let last = ((c + half) * side).ceil().min(side) as u32;
        first..last
    };
    for y in pixels(object.center.1) {
        for x in pixels(object.center.0) {
            let dx = (f64::from(x) + 0.5) / side - object.center.0;
            let dy = (f64::from(y) + 0.5) / side - object.center.1;
            let inside = match object.shape {
                Shape::Circle => dx * dx + dy * dy <= half * half,
                Shape::Square => dx.abs() <= half && dy.abs() <= half,
                Shape::Triangle => dy <= half && dx.abs() <= (dy + half) / 2.0,
            };
            if inside {
                image.put_pixel(x, y, object.color.rgb());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{sample_tasks, Position};

    #[test]
    fn faded_pictures_keep_their_layout_but_score_nothing() {
        let task = Task::parse("a photo of a red circle and a blue square").unwrap();
        let vivid = render(&task, 3, 32);
        let mut faded = vivid.clone();
        fade(&mut faded, FADED_STRENGTH);
        assert_eq!(faded.get_pixel(0, 0), &BACKGROUND);
        assert_eq!(crate::detect(&vivid).len(), 2);
        assert!(crate::detect(&faded).is_empty());
        // Red (220, 30, 30) keeps 0.3 of its difference from white: (244.5, 187.5, 187.5), rounded.
        let red = vivid.pixels().zip(faded.pixels()).find(|(v, _)| v.0 == [220, 30, 30]);
        assert_eq!(red.map(|(_, f)| f.0), Some([245, 188, 188]));
        let mut kept = vivid.clone();
        fade(&mut kept, 1.0);
        assert_eq!(kept, vivid);
    }

    #[test]
    fn images_are_seeded() {
        let tasks = sample_tasks(1, 12);
        for task in &tasks {
            let image = render(task, 5, 32);
            assert_eq!(image.dimensions(), (32, 32));
            assert_eq!(image, render(task, 5, 32), "{}", task.prompt);
            assert_ne!(image, render(task, 6, 32), "{}", task.prompt);
            assert!(image.pixels().any(|p| *p != BACKGROUND), "{} draws something", task.prompt);
        }
    }

    #[test]
    #[should_panic(expected = "cannot lay out \"a circle left of a square left of it\"")]
    fn contradicting_relations_are_refused() {
        let mut task = Task::parse("a photo of a circle left of a square").unwrap();
        task.requirements[1].position =
            task.requirements[0].position.map(|p| Position { object: 0, ..p });
        task.prompt = "a circle left of a square left of it".into();
        render(&task, 0, 32);
    }

    #[test]
    fn a_square_covers_its_pixels_exactly() {
        let mut image = RgbImage::from_pixel(40, 40, BACKGROUND);
        let square = Object {
            shape: Shape::Square,
            color: Color::Blue,
            requirement: 0,
            center: (0.5, 0.5),
            size: 0.25,
        };
        draw(&mut image, &square);
        let blue: Vec<(u32, u32)> = image
            .enumerate_pixels()
            .filter(|p| *p.2 == Color::Blue.rgb())
            .map(|p| (p.0, p.1))
            .collect();
        assert_eq!(blue.len(), 100);
        assert_eq!((blue[0], blue[99]), ((15, 15), (24, 24)));
    }
}
