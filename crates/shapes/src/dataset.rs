//! Prompt files in the reference layout, as `flowtune_data::PromptDataset::load` reads them.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use serde_json::json;

use crate::Task;

/// Writes one JSON object per task to `path`:
/// `{"data_source": …, "prompt": …, "extra_info": {"task": <Task>, "category": "<name>"}}`.
/// There is no `reward_model.ground_truth`: the `shapes_geneval` reward reads `extra_info.task`.
pub fn write_prompts_jsonl(path: &Path, tasks: &[Task], data_source: &str) -> std::io::Result<()> {
    let mut out = BufWriter::new(File::create(path)?);
    for task in tasks {
        let record = json!({
            "data_source": data_source,
            "prompt": task.prompt,
            "extra_info": {"task": task, "category": task.category.name()},
        });
        writeln!(out, "{record}")?;
    }
    out.flush()
}
