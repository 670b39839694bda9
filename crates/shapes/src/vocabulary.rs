//! The words shapes prompts are made of, for a word-level tokenizer.

use crate::{Color, Relation, Shape};

/// Words in the longest prompt ("a photo of a red circle and a blue square").
pub const MAX_PROMPT_WORDS: usize = 10;

/// Every word any prompt uses, each once, in a fixed order.
pub fn vocabulary() -> Vec<String> {
    let mut words: Vec<String> =
        ["a", "photo", "of", "and", "one", "two", "three", "four"].map(String::from).to_vec();
    for shape in Shape::ALL {
        words.push(shape.noun(1));
        words.push(shape.noun(2));
    }
    words.extend(Color::ALL.map(|c| c.name().to_string()));
    for relation in Relation::ALL {
        words.extend(relation.words().split_whitespace().map(String::from));
    }
    let mut seen = std::collections::HashSet::new();
    words.retain(|w| seen.insert(w.clone()));
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_prompt_word_is_in_the_vocabulary_and_no_prompt_is_longer_than_the_maximum() {
        let vocabulary = vocabulary();
        let tasks = crate::sample_tasks(3, 3000);
        for task in &tasks {
            let words: Vec<&str> = task.prompt.split_whitespace().collect();
            assert!(words.len() <= MAX_PROMPT_WORDS, "{}", task.prompt);
            for w in words {
                assert!(vocabulary.iter().any(|v| v == w), "{w:?} of {:?}", task.prompt);
            }
        }
        let longest = tasks.iter().map(|t| t.prompt.split_whitespace().count()).max();
        assert_eq!(longest, Some(MAX_PROMPT_WORDS));
    }
}
