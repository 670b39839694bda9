//! What a prompt row's condition pictures add to one sample's denoiser sequence, worked out from
//! the pictures' sizes and the pipeline's configs alone, as each family's pipeline sizes them:
//! `flowtune plan` counts it before anything loads.

use std::path::Path;

use crate::pipeline::PipelineDir;
use crate::registry::family_of;
use crate::tokenizer::TextTokenizer;
use crate::ModelError;

/// The condition pictures of one sample as its denoiser sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConditionSizes {
    /// Each picture's (width, height) in pixels as the VAE encodes it into image-stream tokens.
    pub encoded: Vec<(u32, u32)>,
    /// Tokens the pictures add to the prompt's text sequence (vision tokens and their markers).
    pub text_tokens: u64,
    /// Whether the pipeline then cuts the prompt, pictures and all, at `max_sequence_length`
    /// (Edit-Plus), which so still bounds the text sequence.
    pub cut_at_max_sequence_length: bool,
}

/// A family's sizing of rows of condition pictures, each picture as (width, height), for the
/// pipeline folder `dir`, at Qwen-Image 2.1's `output_resolution` (`None`: the pipeline's
/// default); one answer per row.
pub type SizeConditions =
    fn(&PipelineDir, &[Vec<(u32, u32)>], Option<u32>) -> Result<Vec<ConditionSizes>, ModelError>;

/// Families whose pictures add no tokens (a held first frame, or none taken).
pub fn no_tokens(
    _: &PipelineDir,
    rows: &[Vec<(u32, u32)>],
    _: Option<u32>,
) -> Result<Vec<ConditionSizes>, ModelError> {
    Ok(vec![ConditionSizes::default(); rows.len()])
}

/// The tokenizer in `dir`, or `None` for a config-only folder without one (`flowtune plan` on
/// `examples/models`).
pub(crate) fn tokenizer_in(dir: &Path) -> Result<Option<TextTokenizer>, ModelError> {
    let files = ["tokenizer.json", "vocab.json"];
    if files.iter().any(|f| dir.join(f).exists()) {
        TextTokenizer::load(dir).map(Some)
    } else {
        Ok(None)
    }
}

/// Text tokens `words` (the text before a picture's `<|vision_start|>`, which special tokens
/// fence off from the rest of the prompt) and the two vision markers take in `tokenizer`;
/// without one, as Qwen's pre-tokenizer splits them (a token per run of letters, digit, run of
/// spaces or symbol), which BPE merges no further there.
pub(crate) fn marker_tokens(
    tokenizer: Option<&TextTokenizer>,
    words: &str,
) -> Result<u64, ModelError> {
    let count = match tokenizer {
        Some(tokenizer) => tokenizer.ids(words)?.len(),
        None => {
            let class = |c: char| match c {
                c if c.is_alphabetic() => 0,
                c if c.is_whitespace() => 1,
                c if c.is_numeric() => 2,
                _ => 3,
            };
            let chars: Vec<char> = words.chars().collect();
            let runs = chars.windows(2).filter(|w| class(w[0]) != class(w[1]) || class(w[0]) >= 2);
            runs.count() + usize::from(!chars.is_empty())
        }
    };
    Ok(count as u64 + 2)
}

/// What each row's condition pictures (width, height) add under the pipeline at `path`.
pub fn condition_sizes(
    path: &Path,
    rows: &[Vec<(u32, u32)>],
    output_resolution: Option<u32>,
) -> Result<Vec<ConditionSizes>, ModelError> {
    if rows.iter().all(Vec::is_empty) {
        return Ok(vec![ConditionSizes::default(); rows.len()]);
    }
    let dir = PipelineDir::open(path)?;
    let family = family_of(&dir.index.class_name)?;
    (family.condition_sizes)(&dir, rows, output_resolution)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a tokenizer the words count as Qwen's pre-tokenizer splits them.
    #[test]
    fn words_count_by_their_runs_without_a_tokenizer() {
        // `Picture`, ` `, `1`, `:`, ` ` and the two markers.
        assert_eq!(marker_tokens(None, "Picture 1: ").unwrap(), 7);
        assert_eq!(marker_tokens(None, "Picture 12: ").unwrap(), 8);
        // `<`, `image`, `1`, `>`.
        assert_eq!(marker_tokens(None, "<image1>").unwrap(), 6);
        assert_eq!(marker_tokens(None, "").unwrap(), 2);
    }
}
