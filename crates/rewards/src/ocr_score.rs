//! The OCR score of the reference frameworks (flow_grpo, VeRL-Omni): how close recognised text is
//! to the text the prompt asked for.

use crate::Sample;

/// `1 − min(d, |gt|) / |gt|` where both texts are lower-cased with all whitespace removed, and `d`
/// is 0 when the ground truth appears inside the recognised text, else their Levenshtein distance
/// in characters (Unicode scalar values). `None` for an empty ground truth, which has no score.
pub fn ocr_score(recognised: &str, ground_truth: &str) -> Option<f64> {
    let normal = |s: &str| -> String {
        s.chars().filter(|c| !c.is_whitespace()).flat_map(char::to_lowercase).collect()
    };
    let (text, gt) = (normal(recognised), normal(ground_truth));
    let len = gt.chars().count();
    if len == 0 {
        return None;
    }
    let distance = if text.contains(&gt) { 0 } else { levenshtein(&text, &gt) };
    Some(1.0 - distance.min(len) as f64 / len as f64)
}

/// The OCR score of `text` read from `sample` (the `index`-th of its batch); `fail` makes the
/// error, naming the sample, when it has no ground truth or an empty one.
pub(crate) fn score_read_text<E>(
    index: usize,
    sample: &Sample<'_>,
    text: &str,
    fail: impl Fn(String) -> E,
) -> Result<f64, E> {
    let gt = sample.ground_truth.ok_or_else(|| {
        fail(format!(
            "sample {index} (prompt {:?}) has no ground truth: give reward_model.ground_truth or quote the text in the prompt",
            sample.prompt
        ))
    })?;
    ocr_score(text, gt)
        .ok_or_else(|| fail(format!("sample {index}: the ground truth {gt:?} is empty")))
}

/// Edit distance (insertions, deletions, substitutions) between the characters of `a` and `b`.
fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1).min(row[j] + 1).min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_rule() {
        assert_eq!(ocr_score("Open 24 H", "OPEN 24H"), Some(1.0), "case and spaces do not count");
        assert_eq!(ocr_score("THE SHOP IS OPEN 24H TODAY", "open 24h"), Some(1.0), "a substring");
        assert_eq!(ocr_score("OPFN 24H", "OPEN 24H"), Some(1.0 - 1.0 / 7.0));
        assert_eq!(ocr_score("", "hello"), Some(0.0), "nothing read");
        assert_eq!(ocr_score("completely different text", "hi"), Some(0.0), "capped at |gt|");
        assert_eq!(ocr_score("kitten", "sitting"), Some(1.0 - 3.0 / 7.0));
        assert_eq!(ocr_score("anything", " \t"), None, "an empty ground truth has no score");
    }

    #[test]
    fn unicode_counts_characters_not_bytes() {
        assert_eq!(ocr_score("咖啡店", "咖啡店"), Some(1.0));
        assert_eq!(ocr_score("咖啡厅", "咖啡店"), Some(1.0 - 1.0 / 3.0));
        assert_eq!(ocr_score("CAFÉ", "café"), Some(1.0), "lower-casing is Unicode-aware");
        assert_eq!(ocr_score("cafe", "café"), Some(0.75));
    }
}
