//! Prompts: datasets read from text (one prompt per line) or JSONL in the reference layout, and
//! the seeded loader that yields each training step's prompts, every one repeated `n` times with
//! its copies adjacent and one uid per prompt; preference pairs for offline DPO; OCR prompt files
//! written in the reference parquet layout.

mod dataset;
mod loader;
mod pairs;
mod reference_parquet;

pub use dataset::{load_picture, picture_size, quoted_target, PromptDataset, PromptRecord};
pub use loader::{LoaderState, PromptLoader, Row};
pub use pairs::{load_pairs, pair_prompts, PreferencePair};
pub use reference_parquet::{
    ocr_rows, write_reference_parquet, ReferenceRow, QWEN_IMAGE_SYSTEM_PROMPT,
};

/// Why a dataset could not be read or served.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("cannot read {path}: {message}")]
    Io { path: String, message: String },
    #[error("{path}:{line}: {message}")]
    Record { path: String, line: usize, message: String },
    #[error("{0}")]
    Invalid(String),
}
