//! Tasks: a prompt's category and the objects it requires, and their seeded sampling.

use std::fmt;

use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::Color;

/// A shape. Squares are axis-aligned; triangles are isosceles, point up, as wide as tall.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Shape {
    Circle,
    Square,
    Triangle,
}

impl Shape {
    /// Every shape.
    pub const ALL: [Shape; 3] = [Shape::Circle, Shape::Square, Shape::Triangle];

    /// The singular noun in prompts.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Circle => "circle",
            Shape::Square => "square",
            Shape::Triangle => "triangle",
        }
    }

    /// The noun for `count` objects: `circle` or `circles`.
    pub fn noun(self, count: u32) -> String {
        if count == 1 {
            self.name().to_string()
        } else {
            format!("{}s", self.name())
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where one object is relative to another, in image coordinates (y grows downwards).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    LeftOf,
    RightOf,
    Above,
    Below,
}

impl Relation {
    /// Every relation.
    pub const ALL: [Relation; 4] =
        [Relation::LeftOf, Relation::RightOf, Relation::Above, Relation::Below];

    /// The words in prompts.
    pub fn words(self) -> &'static str {
        match self {
            Relation::LeftOf => "left of",
            Relation::RightOf => "right of",
            Relation::Above => "above",
            Relation::Below => "below",
        }
    }

    /// `(along, across)`: how far point `a` is from `b` in the relation's direction (positive when
    /// `a` is `self` of `b`), and the offset on the other axis.
    pub fn offsets(self, a: (f64, f64), b: (f64, f64)) -> (f64, f64) {
        let (dx, dy) = (b.0 - a.0, b.1 - a.1);
        match self {
            Relation::LeftOf => (dx, dy),
            Relation::RightOf => (-dx, dy),
            Relation::Above => (dy, dx),
            Relation::Below => (-dy, dx),
        }
    }
}

/// GenEval's task categories.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// `a photo of a circle`
    SingleObject,
    /// `a photo of a circle and a square` (two different shapes)
    TwoObject,
    /// `a photo of three triangles` (one to four, exactly)
    Counting,
    /// `a photo of a blue square`
    Colors,
    /// `a photo of a circle left of a square` (two different shapes)
    Position,
    /// `a photo of a red circle and a blue square` (different shapes, different colours)
    ColorAttr,
}

impl Category {
    /// Every category, in the order [`sample_tasks`] cycles through them.
    pub const ALL: [Category; 6] = [
        Category::SingleObject,
        Category::TwoObject,
        Category::Counting,
        Category::Colors,
        Category::Position,
        Category::ColorAttr,
    ];

    /// GenEval's name (`single_object`, `two_object`, `counting`, `colors`, `position`,
    /// `color_attr`), also the serialised form.
    pub fn name(self) -> &'static str {
        match self {
            Category::SingleObject => "single_object",
            Category::TwoObject => "two_object",
            Category::Counting => "counting",
            Category::Colors => "colors",
            Category::Position => "position",
            Category::ColorAttr => "color_attr",
        }
    }
}

/// Where a requirement's object must be: `relation` an object of requirement number `object`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Position {
    pub relation: Relation,
    pub object: usize,
}

/// One object a prompt asks for (see [`crate::evaluate`] for how each field is checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requirement {
    pub shape: Shape,
    /// How many: exactly for [`Category::Counting`], at least otherwise.
    pub count: u32,
    /// The colour those objects must have; any when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub color: Option<Color>,
    /// Where one of those objects must be relative to one of another requirement's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<Position>,
}

impl Requirement {
    fn one(shape: Shape) -> Self {
        Self { shape, count: 1, color: None, position: None }
    }
}

/// A prompt with its category and requirements; serialised as JSON in datasets:
///
/// ```json
/// {"category": "position", "prompt": "a photo of a circle left of a square", "requirements": [
///   {"shape": "circle", "count": 1, "position": {"relation": "left_of", "object": 1}},
///   {"shape": "square", "count": 1}]}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    pub category: Category,
    pub prompt: String,
    pub requirements: Vec<Requirement>,
}

impl Task {
    /// A random task of `category`, uniform over its shapes, colours, counts and relations.
    pub fn sample<R: Rng + ?Sized>(rng: &mut R, category: Category) -> Task {
        let mut shapes = Shape::ALL;
        shapes.shuffle(rng);
        let mut colors = Color::ALL;
        colors.shuffle(rng);
        let [a, b, _] = shapes.map(Requirement::one);
        let colored = |r: Requirement, c| Requirement { color: Some(c), ..r };
        let requirements = match category {
            Category::SingleObject => vec![a],
            Category::TwoObject => vec![a, b],
            Category::Counting => vec![Requirement { count: rng.random_range(1..=4), ..a }],
            Category::Colors => vec![colored(a, colors[0])],
            Category::Position => {
                let relation = *Relation::ALL.choose(rng).expect("relations");
                vec![Requirement { position: Some(Position { relation, object: 1 }), ..a }, b]
            }
            Category::ColorAttr => vec![colored(a, colors[0]), colored(b, colors[1])],
        };
        Task::build(category, requirements)
    }

    /// A near miss of this task: the same category with one attribute changed so that a scene
    /// of it fails this task's prompt (another shape, a count one off, another colour, the
    /// opposite relation, the two colours swapped). Captioning such scenes with the original
    /// prompt teaches a model the task with unreliable binding, the regime RL sharpens.
    pub fn slip<R: Rng + ?Sized>(&self, rng: &mut R) -> Task {
        let mut r = self.requirements.clone();
        let other_shape = |rng: &mut R, not: &[Shape]| {
            let left: Vec<Shape> = Shape::ALL.into_iter().filter(|s| !not.contains(s)).collect();
            *left.choose(rng).expect("a shape is left")
        };
        match self.category {
            Category::SingleObject => r[0].shape = other_shape(rng, &[r[0].shape]),
            Category::TwoObject => {
                let i = rng.random_range(0..2);
                r[i].shape = other_shape(rng, &[r[0].shape, r[1].shape]);
            }
            Category::Counting => {
                let c = r[0].count;
                r[0].count = match c {
                    1 => 2,
                    4 => 3,
                    _ if rng.random_bool(0.5) => c - 1,
                    _ => c + 1,
                };
            }
            Category::Colors => {
                let now = r[0].color;
                let left: Vec<Color> = Color::ALL.into_iter().filter(|c| Some(*c) != now).collect();
                r[0].color = left.choose(rng).copied();
            }
            Category::Position => {
                let p = r[0].position.as_mut().expect("position tasks have a relation");
                p.relation = match p.relation {
                    Relation::LeftOf => Relation::RightOf,
                    Relation::RightOf => Relation::LeftOf,
                    Relation::Above => Relation::Below,
                    Relation::Below => Relation::Above,
                };
            }
            Category::ColorAttr => {
                let (a, b) = (r[0].color, r[1].color);
                (r[0].color, r[1].color) = (b, a);
            }
        }
        Task::build(self.category, r)
    }
}

/// `n` tasks from `seed`, deterministically: task `i` is of category `Category::ALL[i % 6]`.
pub fn sample_tasks(seed: u64, n: usize) -> Vec<Task> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|i| Task::sample(&mut rng, Category::ALL[i % Category::ALL.len()])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_are_seeded_and_balanced() {
        let tasks = sample_tasks(7, 600);
        assert_eq!(tasks, sample_tasks(7, 600));
        assert_ne!(tasks, sample_tasks(8, 600));
        for category in Category::ALL {
            assert_eq!(tasks.iter().filter(|t| t.category == category).count(), 100);
        }
        let counts: Vec<u32> = tasks
            .iter()
            .filter(|t| t.category == Category::Counting)
            .map(|t| t.requirements[0].count)
            .collect();
        assert!((1..=4).all(|n| counts.contains(&n)), "every count occurs: {counts:?}");
    }

    #[test]
    fn tasks_round_trip_through_json() {
        for task in sample_tasks(3, 60) {
            let json = serde_json::to_string(&task).unwrap();
            assert_eq!(serde_json::from_str::<Task>(&json).unwrap(), task, "{json}");
        }
        let json = serde_json::to_value(&sample_tasks(0, 5)[4]).unwrap();
        assert_eq!(json["category"], "position");
        assert!(json["requirements"][0]["position"]["relation"].is_string(), "{json}");
    }

    #[test]
    fn a_slip_keeps_the_category_and_fails_the_prompt() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for (i, task) in sample_tasks(5, 600).into_iter().enumerate() {
            let slip = task.slip(&mut rng);
            assert_eq!(slip.category, task.category);
            assert_ne!(slip.prompt, task.prompt);
            let scene = crate::render(&slip, i as u64, 64);
            assert!(
                !crate::score(&task, &scene).correct,
                "{} drawn as {}",
                task.prompt,
                slip.prompt
            );
        }
    }

    #[test]
    fn relation_offsets_point_the_named_way() {
        let (left, right) = ((0.2, 0.5), (0.7, 0.6));
        let (along, across) = Relation::LeftOf.offsets(left, right);
        assert!((along - 0.5).abs() < 1e-12 && (across - 0.1).abs() < 1e-12);
        assert!(Relation::RightOf.offsets(right, left).0 > 0.0);
        assert!(Relation::Above.offsets(left, right).0 > 0.0);
        assert!(Relation::Below.offsets(left, right).0 < 0.0);
    }
}
