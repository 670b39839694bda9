//! Shapes world: a CPU-scale text-to-image task in the spirit of GenEval. Prompts ask for
//! coloured circles, squares and triangles on a white background, in GenEval's six categories
//! ([`Category`]); [`render`] draws a seeded scene satisfying a [`Task`], and [`score`] finds the
//! objects in an image ([`detect`]) and checks the task's requirements ([`evaluate`]).
//!
//! ```
//! use flowtune_shapes::{render, score, Task};
//! let task = Task::parse("a photo of a red circle left of a square").unwrap_err();
//! assert!(task.reason.contains("no colours"));
//! let task = Task::parse("a photo of a circle left of a square").unwrap();
//! assert!(score(&task, &render(&task, 0, 32)).correct);
//! ```

mod dataset;
mod detect;
mod diversity;
mod evaluate;
mod palette;
mod prompt;
mod render;
mod task;
mod vocabulary;

pub use dataset::write_prompts_jsonl;
pub use detect::{detect, Detection, MAX_ASPECT, MAX_SHAPE_DISTANCE, MIN_AREA_FRACTION};
pub use diversity::{entropy_bits, ColorCounts};
pub use evaluate::{evaluate, Evaluation, POSITION_MARGIN};
pub use palette::{classify_pixel, Color, BACKGROUND, MAX_RESIDUAL};
pub use prompt::ParseError;
pub use render::{fade, render, size_range, FADED_STRENGTH, GAP, MARGIN, RELATION_OFFSET};
pub use task::{sample_tasks, Category, Position, Relation, Requirement, Shape, Task};
pub use vocabulary::{vocabulary, MAX_PROMPT_WORDS};

/// An RGB image, row-major u8 (H × W × 3).
pub type RgbImage = image::RgbImage;

/// Detects the objects in `image` and checks `task` against them.
pub fn score(task: &Task, image: &RgbImage) -> Evaluation {
    evaluate(task, &detect(image))
}
