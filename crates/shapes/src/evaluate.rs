//! Checking a task's requirements against detections, GenEval's way.

use crate::{Category, Detection, Task};

/// How far apart (a fraction of the image side) two centroids must be along a relation's axis.
pub const POSITION_MARGIN: f64 = 0.1;

/// The verdict on one image.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// Every check passed.
    pub correct: bool,
    /// The fraction of checks passed (see [`evaluate`]).
    pub partial: f64,
    /// One line per failed check.
    pub failures: Vec<String>,
}

/// Checks `task` against `detections`. Each requirement makes one or two checks:
///
/// - count: the detections of its shape (and of its colour, when it names one) number exactly
///   `count` for [`Category::Counting`] and at least `count` otherwise — extra objects are
///   allowed, as in GenEval;
/// - position (when it has one): some detection counted above is `relation` some detection of
///   the other requirement, their centroids at least [`POSITION_MARGIN`] apart along the
///   relation's axis (`left of`: A.x + margin ≤ B.x; the other axis is not checked).
///
/// `partial` is the fraction of checks passed: for `a circle left of a square`, finding both
/// shapes in the wrong order scores 2/3.
pub fn evaluate(task: &Task, detections: &[Detection]) -> Evaluation {
    let matching: Vec<Vec<&Detection>> = task
        .requirements
        .iter()
        .map(|r| {
            detections
                .iter()
                .filter(|d| d.shape == r.shape && r.color.is_none_or(|c| c == d.color))
                .collect()
        })
        .collect();
    let (mut checks, mut failures) = (0, vec![]);
    for (r, found) in task.requirements.iter().zip(&matching) {
        checks += 1;
        let n = found.len() as u32;
        let what = match r.color {
            Some(color) => format!("{color} {}", r.shape.noun(r.count)),
            None => r.shape.noun(r.count),
        };
        if task.category == Category::Counting && n != r.count {
            failures.push(format!("expected exactly {} {what}, found {n}", r.count));
        } else if n < r.count {
            failures.push(format!("expected at least {} {what}, found {n}", r.count));
        }
        if let Some(p) = r.position {
            checks += 1;
            let others = matching.get(p.object).map_or(&[][..], Vec::as_slice);
            let holds = found.iter().any(|a| {
                others
                    .iter()
                    .any(|b| p.relation.offsets(a.centroid, b.centroid).0 >= POSITION_MARGIN)
            });
            if !holds {
                let other = task.requirements.get(p.object).map_or("?", |o| o.shape.name());
                failures.push(format!("no {} {} a {other}", r.shape, p.relation.words()));
            }
        }
    }
    let partial = match checks {
        0 => 1.0,
        _ => (checks - failures.len()) as f64 / checks as f64,
    };
    Evaluation { correct: failures.is_empty(), partial, failures }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Color, Shape};
    use Color::{Blue, Red};
    use Shape::{Circle, Square};

    fn at(shape: Shape, color: Color, x: f64, y: f64) -> Detection {
        Detection { shape, color, centroid: (x, y), area: 100, bbox: [0; 4] }
    }

    fn check(prompt: &str, detections: &[Detection]) -> Evaluation {
        evaluate(&Task::parse(prompt).unwrap(), detections)
    }

    #[test]
    fn counting_is_exact_and_other_counts_are_at_least() {
        let circle = at(Circle, Red, 0.2, 0.2);
        let square = at(Square, Blue, 0.8, 0.8);
        assert!(check("a photo of two circles", &[circle, circle, square]).correct);
        let three = check("a photo of two circles", &[circle, circle, circle]);
        assert_eq!(three.failures, ["expected exactly 2 circles, found 3"]);
        assert_eq!(three.partial, 0.0);
        assert!(check("a photo of a circle", &[circle, circle, square]).correct);
        assert!(check("a photo of a square and a circle", &[circle, square]).correct);
        let none = check("a photo of a square and a circle", &[]);
        assert_eq!((none.correct, none.partial, none.failures.len()), (false, 0.0, 2));
    }

    #[test]
    fn colours_bind_to_their_shapes() {
        let prompt = "a photo of a red circle and a blue square";
        assert!(check(prompt, &[at(Circle, Red, 0.2, 0.2), at(Square, Blue, 0.8, 0.8)]).correct);
        let swapped = check(prompt, &[at(Circle, Blue, 0.2, 0.2), at(Square, Red, 0.8, 0.8)]);
        assert_eq!(swapped.partial, 0.0);
        assert_eq!(swapped.failures[0], "expected at least 1 red circle, found 0");
        let half = check(prompt, &[at(Circle, Red, 0.2, 0.2), at(Square, Red, 0.8, 0.8)]);
        assert_eq!((half.correct, half.partial), (false, 0.5));
    }

    #[test]
    fn positions_compare_centroids_with_a_margin() {
        let prompt = "a photo of a circle left of a square";
        let circle = at(Circle, Red, 0.3, 0.5);
        assert!(check(prompt, &[circle, at(Square, Blue, 0.41, 0.9)]).correct, "y is free");
        let close = check(prompt, &[circle, at(Square, Blue, 0.39, 0.5)]);
        assert_eq!(close.failures, ["no circle left of a square"]);
        assert!((close.partial - 2.0 / 3.0).abs() < 1e-12);
        let some_pair = [at(Circle, Red, 0.9, 0.5), circle, at(Square, Blue, 0.6, 0.5)];
        assert!(check(prompt, &some_pair).correct, "any circle–square pair will do");
        let below = "a photo of a circle below a square";
        assert!(check(below, &[at(Circle, Red, 0.5, 0.8), at(Square, Blue, 0.5, 0.2)]).correct);
        assert!(!check(below, &[at(Circle, Red, 0.5, 0.2), at(Square, Blue, 0.5, 0.8)]).correct);
    }
}
