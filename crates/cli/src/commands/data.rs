//! `flowtune data`: preparing prompt sets in the reference framework's layout.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use flowtune_data::{ocr_rows, write_reference_parquet, QWEN_IMAGE_SYSTEM_PROMPT};

use crate::Failure;

#[derive(Subcommand)]
pub enum DataCommand {
    /// An OCR prompt file (one prompt per line; the quoted text is what must be rendered) as
    /// parquet in the reference layout, with the ground truth in `reward_model.ground_truth`.
    Ocr(OcrArgs),
}

#[derive(Args)]
pub struct OcrArgs {
    /// One prompt per line, e.g. flow_grpo's `dataset/ocr/train.txt`.
    prompts: PathBuf,
    /// The `.parquet` file to write.
    out: PathBuf,
    /// `extra_info.split` of every row.
    #[arg(long, default_value = "train")]
    split: String,
    /// Put Qwen-Image's system prompt before each prompt as a system turn.
    #[arg(long)]
    qwen_image_system_prompt: bool,
}

pub fn run(command: DataCommand) -> Result<(), Failure> {
    let DataCommand::Ocr(a) = command;
    let system = a.qwen_image_system_prompt.then_some(QWEN_IMAGE_SYSTEM_PROMPT);
    let rows = ocr_rows(&a.prompts, &a.split, system).map_err(Failure::input)?;
    write_reference_parquet(&a.out, &rows).map_err(|e| Failure::Runtime(e.into()))?;
    println!("wrote {} OCR prompts to {}", rows.len(), a.out.display());
    Ok(())
}
