//! Preference pairs for offline Diffusion-DPO: one JSONL line per pair,
//! `{"prompt": …, "chosen": "a.png", "rejected": "b.png", "chosen_score": 0.9, "rejected_score": 0.2}`
//! with image paths relative to the file and the scores optional.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::{DataError, PromptDataset, PromptRecord};

/// One (chosen, rejected) pair of images for a prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct PreferencePair {
    pub prompt: String,
    pub chosen: PathBuf,
    pub rejected: PathBuf,
    pub chosen_score: Option<f64>,
    pub rejected_score: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    prompt: String,
    chosen: PathBuf,
    rejected: PathBuf,
    chosen_score: Option<f64>,
    rejected_score: Option<f64>,
}

/// Reads the pairs of `path`; every image must exist and a chosen score, when both are given,
/// must not be below the rejected one.
pub fn load_pairs(path: &Path) -> Result<Vec<PreferencePair>, DataError> {
    let label = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| DataError::Io { path: label.clone(), message: e.to_string() })?;
    let base = path.parent().unwrap_or(Path::new("."));
    let mut pairs = vec![];
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let record =
            |message: String| DataError::Record { path: label.clone(), line: i + 1, message };
        let l: Line = serde_json::from_str(line)
            .map_err(|e| record(format!("expected a pair (prompt, chosen, rejected): {e}")))?;
        let (chosen, rejected) = (base.join(&l.chosen), base.join(&l.rejected));
        for image in [&chosen, &rejected] {
            if !image.is_file() {
                return Err(record(format!("image {} does not exist", image.display())));
            }
        }
        if let (Some(c), Some(r)) = (l.chosen_score, l.rejected_score) {
            if c < r {
                return Err(record(format!(
                    "chosen_score {c} is below rejected_score {r}; swap chosen and rejected"
                )));
            }
        }
        pairs.push(PreferencePair {
            prompt: l.prompt,
            chosen,
            rejected,
            chosen_score: l.chosen_score,
            rejected_score: l.rejected_score,
        });
    }
    if pairs.is_empty() {
        return Err(DataError::Invalid(format!("{label}: no preference pairs")));
    }
    Ok(pairs)
}

/// The pairs' prompts as a dataset (record i is pair i), for the seeded loader.
pub fn pair_prompts(pairs: &[PreferencePair]) -> PromptDataset {
    PromptDataset {
        records: pairs
            .iter()
            .map(|p| PromptRecord {
                prompt: p.prompt.clone(),
                negative_prompt: None,
                data_source: "preference_pairs".into(),
                ground_truth: None,
                extra_info: Value::Null,
                images: vec![],
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pairs_and_names_bad_lines() {
        let dir = flowtune_fixtures::scratch("pairs");
        for f in ["a.png", "b.png"] {
            std::fs::write(dir.join(f), b"x").unwrap();
        }
        let file = dir.join("pairs.jsonl");
        std::fs::write(
            &file,
            "{\"prompt\": \"a red circle\", \"chosen\": \"a.png\", \"rejected\": \"b.png\", \"chosen_score\": 1, \"rejected_score\": 0}\n",
        )
        .unwrap();
        let pairs = load_pairs(&file).unwrap();
        assert_eq!(pairs[0].chosen, dir.join("a.png"));
        assert_eq!(pair_prompts(&pairs).records[0].prompt, "a red circle");
        std::fs::write(
            &file,
            "{\"prompt\": \"p\", \"chosen\": \"a.png\", \"rejected\": \"c.png\"}\n",
        )
        .unwrap();
        let err = load_pairs(&file).unwrap_err().to_string();
        assert!(err.contains("pairs.jsonl:1") && err.contains("c.png does not exist"), "{err}");
        std::fs::write(
            &file,
            "{\"prompt\": \"p\", \"chosen\": \"a.png\", \"rejected\": \"b.png\", \"chosen_score\": 0, \"rejected_score\": 1}\n",
        )
        .unwrap();
        let err = load_pairs(&file).unwrap_err().to_string();
        assert!(err.contains("below rejected_score"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
