//! A diffusers pipeline directory: `model_index.json` names the components, each in its own
//! folder with `config.json` and safetensors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::ModelError;

/// `model_index.json`: the pipeline class and its components (`name → [library, class]`).
#[derive(Debug, Clone)]
pub struct ModelIndex {
    pub class_name: String,
    pub components: BTreeMap<String, (String, String)>,
}

/// A pipeline directory and its index.
#[derive(Debug, Clone)]
pub struct PipelineDir {
    pub root: PathBuf,
    pub index: ModelIndex,
}

impl PipelineDir {
    /// Reads `dir/model_index.json`; `dir` may also be a Hugging Face Hub id in the local cache
    /// ([`crate::hub`]).
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        let dir = &crate::hub::resolve(dir)?;
        let path = dir.join("model_index.json");
        let raw: BTreeMap<String, serde_json::Value> = crate::read_config(&path)?;
        let format =
            |message: String| ModelError::Format { path: path.display().to_string(), message };
        let class_name = raw
            .get("_class_name")
            .and_then(|v| v.as_str())
            .ok_or_else(|| format("no `_class_name`".into()))?
            .to_string();
        let mut components = BTreeMap::new();
        for (name, value) in raw.iter().filter(|(k, _)| !k.starts_with('_')) {
            // Optional components are written as [null, null].
            if let Some([library, class]) = value.as_array().map(Vec::as_slice) {
                if let (Some(l), Some(c)) = (library.as_str(), class.as_str()) {
                    components.insert(name.clone(), (l.to_string(), c.to_string()));
                }
            }
        }
        Ok(Self { root: dir.to_path_buf(), index: ModelIndex { class_name, components } })
    }

    /// The folder of component `name`, checking that the index declares it with one of `classes`.
    pub fn component(&self, name: &str, classes: &[&str]) -> Result<PathBuf, ModelError> {
        let path = self.root.join("model_index.json").display().to_string();
        let (_, class) = self.index.components.get(name).ok_or_else(|| ModelError::Format {
            path: path.clone(),
            message: format!("no component `{name}`"),
        })?;
        if !classes.contains(&class.as_str()) {
            return Err(ModelError::Format {
                path,
                message: format!(
                    "component `{name}` is a {class}; expected {}",
                    classes.join(" or ")
                ),
            });
        }
        Ok(self.root.join(name))
    }

    /// The folder of tokenizer `name`: any tokenizer class whose folder holds a `tokenizer.json`
    /// (current transformers saves them as the generic `TokenizersBackend`).
    pub fn tokenizer(&self, name: &str) -> Result<PathBuf, ModelError> {
        let (_, class) = self.index.components.get(name).ok_or_else(|| ModelError::Format {
            path: self.root.join("model_index.json").display().to_string(),
            message: format!("no component `{name}`"),
        })?;
        let dir = self.root.join(name);
        if !dir.join("tokenizer.json").exists() {
            return Err(ModelError::Format {
                path: dir.display().to_string(),
                message: format!(
                    "tokenizer `{name}` ({class}) has no tokenizer.json; save it with a fast tokenizer"
                ),
            });
        }
        Ok(dir)
    }

    /// Whether the index declares component `name`.
    pub fn has(&self, name: &str) -> bool {
        self.index.components.contains_key(name)
    }
}
