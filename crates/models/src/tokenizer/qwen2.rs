//! Qwen2's byte-level BPE (Qwen2, Qwen2.5, Qwen2.5-VL): NFC, a split by Qwen2's regex, byte-level
//! mapping without a prefix space, and no unknown token — as transformers' `Qwen2Tokenizer` builds
//! it from `vocab.json` and `merges.txt`.

use std::path::Path;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{SplitDelimiterBehavior, Tokenizer};

use crate::ModelError;

/// Qwen2's pre-tokenizer pattern: contractions, letters with one leading non-letter, single
/// digits, punctuation runs, newlines and spaces.
pub const PRETOKENIZE_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Whether a `tokenizer_class` names Qwen2's tokenizer.
pub fn is_qwen2(tokenizer_class: Option<&str>) -> bool {
    matches!(tokenizer_class, Some("Qwen2Tokenizer" | "Qwen2TokenizerFast"))
}

fn build_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Input(format!("building a Qwen2 tokenizer: {e}"))
}

/// The Qwen2 pipeline around a BPE model (no added tokens).
pub fn with_bpe(bpe: BPE) -> Result<Tokenizer, ModelError> {
    let split = Split::new(
        SplitPattern::Regex(PRETOKENIZE_REGEX.into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(build_err)?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_normalizer(Some(NFC));
    tok.with_pre_tokenizer(Some(Sequence::new(vec![
        split.into(),
        ByteLevel::new(false, false, false).into(),
    ])));
    tok.with_decoder(Some(ByteLevelDecoder::new(false, false, false)));
    Ok(tok)
}

/// A Qwen2 tokenizer over an in-memory vocabulary and merges.
pub fn from_parts(vocab: Vocab, merges: Merges) -> Result<Tokenizer, ModelError> {
    with_bpe(BPE::builder().vocab_and_merges(vocab, merges).build().map_err(build_err)?)
}

/// A Qwen2 tokenizer from `dir/vocab.json` and `dir/merges.txt` (added tokens come separately).
pub fn from_vocab_merges(dir: &Path) -> Result<Tokenizer, ModelError> {
    let (vocab, merges) = (dir.join("vocab.json"), dir.join("merges.txt"));
    for file in [&vocab, &merges] {
        if !file.exists() {
            return Err(ModelError::Io {
                path: file.display().to_string(),
                message: "missing (a Qwen2 tokenizer without tokenizer.json needs vocab.json \
                          and merges.txt)"
                    .into(),
            });
        }
    }
    let bpe = BPE::from_file(&vocab.display().to_string(), &merges.display().to_string())
        .build()
        .map_err(|e| ModelError::Format {
        path: dir.display().to_string(),
        message: e.to_string(),
    })?;
    with_bpe(bpe)
}

/// Qwen2.5-VL's added tokens, from id `vocabulary size` on; all but the last
/// [`NON_SPECIAL_ADDED`] are special.
pub const ADDED_TOKENS: [&str; 22] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
];
/// How many of the last [`ADDED_TOKENS`] are not special.
pub const NON_SPECIAL_ADDED: usize = 8;
