//! The prompt grammar, both ways: requirements → canonical text, and text → [`Task`].
//!
//! ```text
//! a photo of a <shape>                                   single_object
//! a photo of a <shape> and a <shape>                     two_object
//! a photo of <one|two|three|four> <shape(s)>             counting
//! a photo of a <colour> <shape>                          colors
//! a photo of a <shape> <left of|right of|above|below> a <shape>   position
//! a photo of a <colour> <shape> and a <colour> <shape>   color_attr
//! ```

use crate::{Category, Color, Position, Relation, Requirement, Shape, Task};

const NUMBERS: [&str; 4] = ["one", "two", "three", "four"];
const SAME_SHAPE: &str = "both objects have the same shape";

/// A prompt outside the grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a shapes prompt: {prompt:?}: {reason} (expected e.g. \"a photo of a red circle and a blue square\")")]
pub struct ParseError {
    pub prompt: String,
    pub reason: String,
}

/// The canonical prompt of requirements of `category`'s form.
fn text(category: Category, requirements: &[Requirement]) -> String {
    let phrase = |r: &Requirement| match r.color {
        Some(color) => format!("a {color} {}", r.shape),
        None => format!("a {}", r.shape),
    };
    let body = match (category, requirements) {
        (Category::Counting, [r]) => {
            format!("{} {}", NUMBERS[r.count as usize - 1], r.shape.noun(r.count))
        }
        (Category::Position, [a @ Requirement { position: Some(p), .. }, b]) => {
            format!("{} {} {}", phrase(a), p.relation.words(), phrase(b))
        }
        _ => requirements.iter().map(phrase).collect::<Vec<_>>().join(" and "),
    };
    format!("a photo of {body}")
}

impl Task {
    /// The task a prompt states. Case and runs of whitespace are ignored; the task keeps the
    /// canonical prompt, so `Task::parse(&task.prompt) == Ok(task)` for every generated task.
    pub fn parse(prompt: &str) -> Result<Task, ParseError> {
        let fail = |reason: String| ParseError { prompt: prompt.to_string(), reason };
        let lower = prompt.to_lowercase();
        let words: Vec<&str> = lower.split_whitespace().collect();
        let body = words
            .strip_prefix(&["a", "photo", "of"][..])
            .ok_or_else(|| fail("it does not start with \"a photo of\"".into()))?;
        let (category, requirements) = parse_body(body).map_err(fail)?;
        Ok(Task::build(category, requirements))
    }

    /// The task with its canonical prompt; `requirements` must have `category`'s form.
    pub(crate) fn build(category: Category, requirements: Vec<Requirement>) -> Task {
        Task { prompt: text(category, &requirements), category, requirements }
    }
}

fn parse_body(body: &[&str]) -> Result<(Category, Vec<Requirement>), String> {
    if let [number, noun] = body {
        if let Some(i) = NUMBERS.iter().position(|n| n == number) {
            let count = i as u32 + 1;
            let shape = Shape::ALL
                .into_iter()
                .find(|s| s.noun(count) == *noun)
                .ok_or_else(|| format!("\"{number} {noun}\" does not count a shape"))?;
            return Ok((Category::Counting, vec![Requirement { count, ..one(shape, None) }]));
        }
    }
    for relation in Relation::ALL {
        let words: Vec<&str> = relation.words().split(' ').collect();
        let Some(at) = body.windows(words.len()).position(|w| w == words) else { continue };
        let (a, b) = (phrase(&body[..at])?, phrase(&body[at + words.len()..])?);
        if a.color.is_some() || b.color.is_some() {
            return Err("position prompts name no colours".into());
        }
        if a.shape == b.shape {
            return Err(SAME_SHAPE.into());
        }
        let a = Requirement { position: Some(Position { relation, object: 1 }), ..a };
        return Ok((Category::Position, vec![a, b]));
    }
    let requirements = body.split(|w| *w == "and").map(phrase).collect::<Result<Vec<_>, _>>()?;
    let colored = requirements.iter().filter(|r| r.color.is_some()).count();
    let category = match (requirements.len(), colored) {
        (1, 0) => Category::SingleObject,
        (1, 1) => Category::Colors,
        (2, 0) => Category::TwoObject,
        (2, 2) => Category::ColorAttr,
        (2, 1) => return Err("either both objects have a colour or neither".into()),
        (n, _) => return Err(format!("{n} objects joined by \"and\"; at most 2")),
    };
    if let [a, b] = requirements[..] {
        if a.shape == b.shape {
            return Err(SAME_SHAPE.into());
        }
        if a.color == b.color && category == Category::ColorAttr {
            return Err("both objects have the same colour".into());
        }
    }
    Ok((category, requirements))
}

/// `a <shape>` or `a <colour> <shape>`.
fn phrase(words: &[&str]) -> Result<Requirement, String> {
    let shape = |word: &str| {
        Shape::ALL
            .into_iter()
            .find(|s| s.name() == word)
            .ok_or_else(|| format!("unknown shape \"{word}\" (circle, square, triangle)"))
    };
    match words {
        ["a", s] => Ok(one(shape(s)?, None)),
        ["a", c, s] => {
            let color = Color::from_name(c).ok_or_else(|| {
                let known: Vec<_> = Color::ALL.iter().map(|c| c.name()).collect();
                format!("unknown colour \"{c}\" ({})", known.join(", "))
            })?;
            Ok(one(shape(s)?, Some(color)))
        }
        _ => Err(format!("\"{}\" is not \"a [colour] shape\"", words.join(" "))),
    }
}

fn one(shape: Shape, color: Option<Color>) -> Requirement {
    Requirement { shape, count: 1, color, position: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample_tasks;

    #[test]
    fn every_sampled_prompt_parses_back_to_its_task() {
        for task in sample_tasks(11, 3000) {
            assert_eq!(Task::parse(&task.prompt).as_ref(), Ok(&task), "{}", task.prompt);
        }
    }

    #[test]
    fn prompts_read_as_geneval_prompts() {
        let parse = |p: &str| Task::parse(p).unwrap();
        let t = parse("a photo of three triangles");
        assert_eq!((t.category, t.requirements[0].count), (Category::Counting, 3));
        assert_eq!(parse("a photo of one circle").requirements[0].count, 1);
        let t = parse("A photo of a  circle RIGHT OF a square ");
        assert_eq!(t.prompt, "a photo of a circle right of a square");
        assert_eq!(
            t.requirements[0].position,
            Some(Position { relation: Relation::RightOf, object: 1 })
        );
        let t = parse("a photo of a red circle and a blue square");
        assert_eq!(t.category, Category::ColorAttr);
        assert_eq!(t.requirements[1].color, Some(Color::Blue));
        assert_eq!(parse("a photo of a yellow triangle").category, Category::Colors);
        assert_eq!(parse("a photo of a square and a circle").category, Category::TwoObject);
        assert_eq!(parse("a photo of a circle").category, Category::SingleObject);
    }

    #[test]
    fn prompts_outside_the_grammar_name_the_prompt_and_the_reason() {
        let reason = |p: &str| {
            let err = Task::parse(p).unwrap_err();
            assert!(err.to_string().contains(&format!("{p:?}")), "{err}");
            err.reason
        };
        assert!(reason("a cat").contains("a photo of"));
        assert!(reason("a photo of a dog").contains("unknown shape \"dog\""));
        assert!(reason("a photo of a pink circle").contains("unknown colour \"pink\""));
        assert!(reason("a photo of one circles").contains("does not count"));
        assert!(reason("a photo of five circles").contains("\"five circles\""));
        assert!(reason("a photo of a circle and a circle").contains("same shape"));
        assert!(reason("a photo of a red circle and a red square").contains("same colour"));
        assert!(reason("a photo of a red circle and a square").contains("both"));
        assert!(reason("a photo of a red circle above a square").contains("no colours"));
        assert!(reason("a photo of a circle above a circle").contains("same shape"));
        assert!(reason("a photo of a circle and a square and a triangle").contains("3 objects"));
    }
}
