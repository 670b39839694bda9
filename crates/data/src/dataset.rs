//! Prompt records and the file formats they come from.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::DataError;

/// One prompt and what its rewards need.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptRecord {
    pub prompt: String,
    pub negative_prompt: Option<String>,
    /// The dataset a record belongs to (validation metrics are grouped by it).
    pub data_source: String,
    /// What the image must show, e.g. the text an OCR prompt quotes.
    pub ground_truth: Option<String>,
    pub extra_info: Value,
    /// Condition pictures of an image-editing prompt (`images` / `image`, top level or in
    /// `extra_info`), resolved against the prompt file's folder.
    pub images: Vec<PathBuf>,
}

impl PromptRecord {
    /// The condition pictures, each as [`load_picture`].
    pub fn load_images(&self, alpha: bool) -> Result<Vec<image::RgbaImage>, DataError> {
        self.images.iter().map(|path| load_picture(path, alpha)).collect()
    }
}

/// A condition picture decoded as 8-bit RGBA (alpha 255 where the file has none). Where the model
/// takes no `alpha`, a picture with a transparent pixel is refused by its path rather than
/// flattened. An unreadable file is named.
pub fn load_picture(path: &Path, alpha: bool) -> Result<image::RgbaImage, DataError> {
    let named = |message: String| DataError::Io { path: path.display().to_string(), message };
    let picture = image::open(path).map_err(|e| named(e.to_string()))?.to_rgba8();
    match picture.pixels().filter(|p| p.0[3] != 255).count() {
        n if n > 0 && !alpha => Err(named(format!(
            "{n} of its {} pixels are transparent, and this model takes opaque condition \
             pictures only (Qwen-Image 2.1 reads alpha); flatten it onto a background first",
            picture.width() * picture.height()
        ))),
        _ => Ok(picture),
    }
}

/// A condition picture's (width, height), read from its header alone; an unreadable file is named.
pub fn picture_size(path: &Path) -> Result<(u32, u32), DataError> {
    image::image_dimensions(path)
        .map_err(|e| DataError::Io { path: path.display().to_string(), message: e.to_string() })
}

/// The text between the first pair of double quotes (straight or curly), as OCR prompts quote
/// their target: `A sign that says "OPEN"` → `OPEN`.
pub fn quoted_target(prompt: &str) -> Option<String> {
    let start = prompt.find(['"', '“'])?;
    let rest = &prompt[start + prompt[start..].chars().next()?.len_utf8()..];
    let end = rest.find(['"', '”'])?;
    Some(rest[..end].to_string()).filter(|s| !s.is_empty())
}

/// Prompts of one file.
#[derive(Debug, Clone)]
pub struct PromptDataset {
    pub records: Vec<PromptRecord>,
}

impl PromptDataset {
    /// Reads `.txt` (one prompt per line), `.jsonl` / `.json` lines, or `.parquet` in the reference
    /// layout (the same fields as the JSONL records).
    pub fn load(path: &Path) -> Result<Self, DataError> {
        let source = path.file_stem().and_then(|s| s.to_str()).unwrap_or("prompts").to_string();
        if path.extension().and_then(|e| e.to_str()) == Some("parquet") {
            return Self::load_parquet(path, &source);
        }
        let text = std::fs::read_to_string(path).map_err(|e| DataError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let is_jsonl = matches!(path.extension().and_then(|e| e.to_str()), Some("jsonl" | "json"));
        let base = path.parent().unwrap_or(Path::new("."));
        let mut records = vec![];
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let record = if is_jsonl {
                serde_json::from_str(line)
                    .map_err(|e| format!("not JSON: {e}"))
                    .and_then(|v| record_from_json(&v, &source, base))
                    .map_err(|message| DataError::Record {
                        path: path.display().to_string(),
                        line: i + 1,
                        message,
                    })?
            } else {
                let prompt = line.trim().to_string();
                PromptRecord {
                    ground_truth: quoted_target(&prompt),
                    prompt,
                    negative_prompt: None,
                    data_source: source.clone(),
                    extra_info: Value::Null,
                    images: vec![],
                }
            };
            records.push(record);
        }
        Self::non_empty(path, records)
    }

    fn non_empty(path: &Path, records: Vec<PromptRecord>) -> Result<Self, DataError> {
        if records.is_empty() {
            return Err(DataError::Invalid(format!("{}: no prompts", path.display())));
        }
        Ok(Self { records })
    }

    /// Parquet rows, each read as a JSON object and parsed like a JSONL record.
    fn load_parquet(path: &Path, source: &str) -> Result<Self, DataError> {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let fail = |message: String| DataError::Io { path: path.display().to_string(), message };
        let file = std::fs::File::open(path).map_err(|e| fail(e.to_string()))?;
        let reader = SerializedFileReader::new(file)
            .map_err(|e| fail(format!("not a parquet file: {e}")))?;
        let rows = reader.get_row_iter(None).map_err(|e| fail(e.to_string()))?;
        let mut records = vec![];
        for (i, row) in rows.enumerate() {
            let row = row.map_err(|e| fail(e.to_string()))?;
            let base = path.parent().unwrap_or(Path::new("."));
            let record =
                record_from_json(&row.to_json_value(), source, base).map_err(|message| {
                    DataError::Record { path: path.display().to_string(), line: i + 1, message }
                })?;
            records.push(record);
        }
        Self::non_empty(path, records)
    }
}

/// A record in the reference layout: `prompt` (a string, or chat messages whose user turn is the
/// prompt), `data_source`, `negative_prompt`, `reward_model.ground_truth`, `extra_info`.
fn record_from_json(v: &Value, default_source: &str, base: &Path) -> Result<PromptRecord, String> {
    let prompt = match &v["prompt"] {
        Value::String(s) => s.clone(),
        Value::Array(messages) => messages
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .ok_or("`prompt` messages have no user turn with string content")?
            .to_string(),
        Value::Null => return Err("no `prompt`".into()),
        other => return Err(format!("`prompt` must be a string or chat messages, got {other}")),
    };
    let text = |key: &Value| key.as_str().map(str::to_string);
    let ground_truth = match &v["reward_model"]["ground_truth"] {
        Value::Null => quoted_target(&prompt),
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    };
    Ok(PromptRecord {
        negative_prompt: text(&v["negative_prompt"]),
        data_source: text(&v["data_source"]).unwrap_or_else(|| default_source.to_string()),
        ground_truth,
        extra_info: v.get("extra_info").cloned().unwrap_or(Value::Null),
        images: condition_images(v, base)?,
        prompt,
    })
}

/// The condition pictures a record names: `images` (a path or a list of paths) or `image`, at
/// the top level or in `extra_info`; relative paths are taken from `base`. A named picture that
/// does not exist is an error.
fn condition_images(v: &Value, base: &Path) -> Result<Vec<PathBuf>, String> {
    let field = ["images", "image"]
        .iter()
        .flat_map(|k| [&v[*k], &v["extra_info"][*k]])
        .find(|f| !f.is_null());
    let names: Vec<&str> = match field {
        None => return Ok(vec![]),
        Some(Value::String(one)) => vec![one.as_str()],
        Some(Value::Array(many)) => many
            .iter()
            .map(|p| p.as_str().ok_or_else(|| format!("`images` entry {p} is not a path")))
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(format!("`images` must be a path or a list of paths, got {other}"))
        }
    };
    names
        .into_iter()
        .map(|name| {
            let path = base.join(name);
            if path.is_file() {
                Ok(path)
            } else {
                Err(format!("condition picture {} does not exist", path.display()))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn condition_pictures_resolve_against_the_file_and_must_exist() {
        let dir = flowtune_fixtures::scratch("images");
        std::fs::write(dir.join("a.png"), b"").unwrap();
        let parse = |line: &str| record_from_json(&serde_json::from_str(line).unwrap(), "s", &dir);
        let r = parse(r#"{"prompt": "p", "images": ["a.png"]}"#).unwrap();
        assert_eq!(r.images, [dir.join("a.png")]);
        let r = parse(r#"{"prompt": "p", "extra_info": {"image": "a.png"}}"#).unwrap();
        assert_eq!(r.images, [dir.join("a.png")]);
        assert!(parse(r#"{"prompt": "p"}"#).unwrap().images.is_empty());
        let err = parse(r#"{"prompt": "p", "image": "missing.png"}"#).unwrap_err();
        assert!(err.contains("missing.png") && err.contains("does not exist"), "{err}");
        let err = parse(r#"{"prompt": "p", "images": 3}"#).unwrap_err();
        assert!(err.contains("list of paths"), "{err}");
    }

    /// Pictures keep their alpha; an RGB file reads as opaque; a translucent one is refused by
    /// its path for a model that takes no alpha.
    #[test]
    fn condition_pictures_load_with_their_alpha() {
        let dir = flowtune_fixtures::scratch("alpha");
        let rgba = image::RgbaImage::from_fn(4, 3, |x, y| image::Rgba([10, 20, 30, (x * y) as u8]));
        rgba.save(dir.join("rgba.png")).unwrap();
        image::RgbImage::from_pixel(2, 2, image::Rgb([1, 2, 3])).save(dir.join("rgb.png")).unwrap();
        let record = |name: &str| PromptRecord {
            prompt: "p".into(),
            negative_prompt: None,
            data_source: "s".into(),
            ground_truth: None,
            extra_info: Value::Null,
            images: vec![dir.join(name)],
        };
        assert_eq!(record("rgba.png").load_images(true).unwrap(), [rgba]);
        let opaque = record("rgb.png").load_images(false).unwrap();
        assert_eq!(opaque[0].get_pixel(1, 1).0, [1, 2, 3, 255]);
        let err = record("rgba.png").load_images(false).unwrap_err().to_string();
        assert!(err.contains("rgba.png") && err.contains("12 of its 12 pixels"), "{err}");
    }

    #[test]
    fn quoted_targets() {
        assert_eq!(
            quoted_target(r#"A shop sign that reads "OPEN 24H" in neon"#).as_deref(),
            Some("OPEN 24H")
        );
        assert_eq!(quoted_target("A poster saying “Hello”").as_deref(), Some("Hello"));
        assert_eq!(quoted_target("a red circle"), None);
        assert_eq!(quoted_target(r#"an empty "" pair"#), None);
    }

    fn parse_json_record(line: &str, source: &str) -> Result<PromptRecord, String> {
        record_from_json(&serde_json::from_str(line).unwrap(), source, Path::new("."))
    }

    #[test]
    fn parquet_in_the_reference_layout() {
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/prompts/reference_layout.parquet"
        ));
        let records = PromptDataset::load(path).unwrap().records;
        assert_eq!(records.len(), 3);
        assert_eq!(records[0].prompt, "A storefront sign that reads \"BAKERY\"");
        assert_eq!(
            (records[0].data_source.as_str(), records[0].ground_truth.as_deref()),
            ("ocr", Some("BAKERY"))
        );
        assert_eq!(records[1].extra_info["index"], 1);
        assert_eq!(
            (records[2].data_source.as_str(), records[2].ground_truth.as_deref()),
            ("geneval", None)
        );
    }

    #[test]
    fn jsonl_records_in_the_reference_layout() {
        let chat = r#"{"data_source": "ocr", "prompt": [{"role": "system", "content": "x"}, {"role": "user", "content": "A sign \"GO\""}], "reward_model": {"ground_truth": "GO!"}, "extra_info": {"id": 3}}"#;
        let r = parse_json_record(chat, "file").unwrap();
        assert_eq!(
            (r.prompt.as_str(), r.data_source.as_str(), r.ground_truth.as_deref()),
            ("A sign \"GO\"", "ocr", Some("GO!"))
        );
        assert_eq!(r.extra_info["id"], 3);
        let plain = parse_json_record(
            r#"{"prompt": "a cat \"MEOW\"", "negative_prompt": "blurry"}"#,
            "file",
        )
        .unwrap();
        assert_eq!(
            (
                plain.data_source.as_str(),
                plain.ground_truth.as_deref(),
                plain.negative_prompt.as_deref()
            ),
            ("file", Some("MEOW"), Some("blurry"))
        );
        assert!(parse_json_record(r#"{"text": "x"}"#, "f").unwrap_err().contains("no `prompt`"));
    }
}
