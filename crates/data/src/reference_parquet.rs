//! Writing prompt sets in the reference framework's parquet layout — `data_source`, `prompt` as
//! chat messages, `reward_model {ground_truth, style}`, `extra_info {index, split}` — the layout
//! [`crate::PromptDataset`] reads back.

use std::path::Path;
use std::sync::Arc;

use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

use crate::DataError;

/// The system prompt of diffusers' `QwenImagePipeline` prompt template.
pub const QWEN_IMAGE_SYSTEM_PROMPT: &str = "Describe the image by detailing the color, shape, size, texture, quantity, text, spatial relationships of the objects and background:";

/// One row of the reference layout.
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceRow {
    pub data_source: String,
    /// Chat messages as (role, content), e.g. an optional system turn, then the user prompt.
    pub messages: Vec<(String, String)>,
    pub ground_truth: String,
    /// How the reward reads the ground truth (`rule` for OCR).
    pub style: String,
    pub index: i64,
    pub split: String,
}

const SCHEMA: &str = "message schema {
  OPTIONAL BYTE_ARRAY data_source (STRING);
  OPTIONAL group prompt (LIST) {
    REPEATED group list {
      OPTIONAL group element {
        OPTIONAL BYTE_ARRAY role (STRING);
        OPTIONAL BYTE_ARRAY content (STRING);
      }
    }
  }
  OPTIONAL group reward_model {
    OPTIONAL BYTE_ARRAY ground_truth (STRING);
    OPTIONAL BYTE_ARRAY style (STRING);
  }
  OPTIONAL group extra_info {
    OPTIONAL INT64 index;
    OPTIONAL BYTE_ARRAY split (STRING);
  }
}";

/// One leaf column's values, maximum definition level and repetition levels.
enum Leaf<'a> {
    Text(Vec<ByteArray>, i16, Option<&'a [i16]>),
    Int(Vec<i64>, i16),
}

/// Writes `rows` to `path` as one row group (every field present, so each leaf's definition
/// level is its maximum; message turns after the first repeat at level 1).
pub fn write_reference_parquet(path: &Path, rows: &[ReferenceRow]) -> Result<(), DataError> {
    let fail = |e: &dyn std::fmt::Display| DataError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let schema = Arc::new(parse_message_type(SCHEMA).map_err(|e| fail(&e))?);
    let file = std::fs::File::create(path).map_err(|e| fail(&e))?;
    let props = Arc::new(WriterProperties::builder().build());
    let mut writer = SerializedFileWriter::new(file, schema, props).map_err(|e| fail(&e))?;
    let mut group = writer.next_row_group().map_err(|e| fail(&e))?;
    let text = |f: &dyn Fn(&ReferenceRow) -> &str| -> Vec<ByteArray> {
        rows.iter().map(|r| ByteArray::from(f(r))).collect()
    };
    let turns = |f: &dyn Fn(&(String, String)) -> &str| -> Vec<ByteArray> {
        rows.iter().flat_map(|r| r.messages.iter().map(|m| ByteArray::from(f(m)))).collect()
    };
    let repetition: Vec<i16> =
        rows.iter().flat_map(|r| (0..r.messages.len()).map(|i| i16::from(i > 0))).collect();
    let (roles, contents) = (turns(&|m| &m.0), turns(&|m| &m.1));
    let indices: Vec<i64> = rows.iter().map(|r| r.index).collect();
    // The leaf columns in schema order, each with its maximum definition level.
    let leaves = [
        Leaf::Text(text(&|r| &r.data_source), 1, None),
        Leaf::Text(roles, 4, Some(&repetition)),
        Leaf::Text(contents, 4, Some(&repetition)),
        Leaf::Text(text(&|r| &r.ground_truth), 2, None),
        Leaf::Text(text(&|r| &r.style), 2, None),
        Leaf::Int(indices, 2),
        Leaf::Text(text(&|r| &r.split), 2, None),
    ];
    for leaf in &leaves {
        let mut column =
            group.next_column().map_err(|e| fail(&e))?.expect("a leaf per schema field");
        match leaf {
            Leaf::Text(values, level, rep) => {
                let levels = vec![*level; values.len()];
                column.typed::<ByteArrayType>().write_batch(values, Some(&levels), *rep)
            }
            Leaf::Int(values, level) => {
                let levels = vec![*level; values.len()];
                column.typed::<Int64Type>().write_batch(values, Some(&levels), None)
            }
        }
        .map_err(|e| fail(&e))?;
        column.close().map_err(|e| fail(&e))?;
    }
    group.close().map_err(|e| fail(&e))?;
    writer.close().map_err(|e| fail(&e))?;
    Ok(())
}

/// The rows of an OCR prompt file (one prompt per line, the quoted text is the ground truth, as
/// flow_grpo's `ocr/train.txt`), with `system` as a system turn before each prompt when given.
pub fn ocr_rows(
    path: &Path,
    split: &str,
    system: Option<&str>,
) -> Result<Vec<ReferenceRow>, DataError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| DataError::Io { path: path.display().to_string(), message: e.to_string() })?;
    let mut rows = vec![];
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let prompt = line.trim();
        let ground_truth = crate::quoted_target(prompt).ok_or_else(|| DataError::Record {
            path: path.display().to_string(),
            line: i + 1,
            message: "no quoted text to render (expected e.g. a sign that reads \"OPEN\")".into(),
        })?;
        let mut messages: Vec<(String, String)> =
            system.map(|s| ("system".to_string(), s.to_string())).into_iter().collect();
        messages.push(("user".into(), prompt.into()));
        rows.push(ReferenceRow {
            data_source: "ocr".into(),
            messages,
            ground_truth,
            style: "rule".into(),
            index: rows.len() as i64,
            split: split.into(),
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ocr_prompts_round_trip_through_the_reference_layout() {
        let dir = flowtune_fixtures::scratch("ocr-parquet");
        let txt = dir.join("train.txt");
        std::fs::write(&txt, "A shop sign that reads \"OPEN 24H\"\n\nA poster saying “Hello”\n")
            .unwrap();
        let rows = ocr_rows(&txt, "train", Some(QWEN_IMAGE_SYSTEM_PROMPT)).unwrap();
        assert_eq!(rows.len(), 2);
        let out = dir.join("train.parquet");
        write_reference_parquet(&out, &rows).unwrap();
        let records = crate::PromptDataset::load(&out).unwrap().records;
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].prompt, "A shop sign that reads \"OPEN 24H\"", "the user turn");
        assert_eq!(records[1].ground_truth.as_deref(), Some("Hello"));
        assert_eq!(records[1].data_source, "ocr");
        assert_eq!(records[1].extra_info, serde_json::json!({"index": 1, "split": "train"}));
        // Without a system turn, and a line without quoted text named by its line number.
        let plain = ocr_rows(&txt, "test", None).unwrap();
        write_reference_parquet(&out, &plain).unwrap();
        let records = crate::PromptDataset::load(&out).unwrap().records;
        assert_eq!(records[0].ground_truth.as_deref(), Some("OPEN 24H"));
        std::fs::write(&txt, "a sign\n").unwrap();
        let err = ocr_rows(&txt, "train", None).unwrap_err().to_string();
        assert!(err.contains("train.txt:1") && err.contains("no quoted text"), "{err}");
    }
}
