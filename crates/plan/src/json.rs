//! A component's `config.json`, read key by key; every error names the file and the key.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::PlanError;

/// One parsed JSON file (or a nested object of one, e.g. `text_config`).
#[derive(Debug, Clone)]
pub struct Json {
    pub path: PathBuf,
    /// Dotted prefix of a nested object, for messages.
    prefix: String,
    value: Value,
}

impl Json {
    pub fn read(path: &Path) -> Result<Self, PlanError> {
        let text = std::fs::read_to_string(path).map_err(|e| PlanError::Read {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let value: Value = serde_json::from_str(&text).map_err(|e| PlanError::Read {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        if !value.is_object() {
            return Err(PlanError::Read {
                path: path.display().to_string(),
                message: "expected a JSON object".into(),
            });
        }
        Ok(Self { path: path.to_path_buf(), prefix: String::new(), value })
    }

    fn error(&self, key: &str, message: impl Into<String>) -> PlanError {
        PlanError::Key {
            path: self.path.display().to_string(),
            key: format!("{}{key}", self.prefix),
            message: message.into(),
        }
    }

    /// The value of `key` unless absent or null.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.value.get(key).filter(|v| !v.is_null())
    }

    /// Whether `key` is present and null.
    pub fn is_null(&self, key: &str) -> bool {
        self.value.get(key).is_some_and(Value::is_null)
    }

    /// The nested object `key`, or this object when there is none (flat legacy configs).
    pub fn nested_or_self(&self, key: &str) -> Self {
        match self.get(key) {
            Some(v) if v.is_object() => Self {
                path: self.path.clone(),
                prefix: format!("{}{key}.", self.prefix),
                value: v.clone(),
            },
            _ => self.clone(),
        }
    }

    /// A non-negative integer; `default` when the key is absent.
    pub fn int(&self, key: &str, default: Option<u64>) -> Result<u64, PlanError> {
        match self.get(key) {
            Some(v) => {
                v.as_u64().ok_or_else(|| self.error(key, format!("{v} is not an integer ≥ 0")))
            }
            None => default.ok_or_else(|| self.error(key, "missing")),
        }
    }

    /// A number; `default` when the key is absent.
    pub fn float(&self, key: &str, default: Option<f64>) -> Result<f64, PlanError> {
        match self.get(key) {
            Some(v) => v.as_f64().ok_or_else(|| self.error(key, format!("{v} is not a number"))),
            None => default.ok_or_else(|| self.error(key, "missing")),
        }
    }

    /// A list of non-negative integers (a single integer counts as a list of one).
    pub fn ints(&self, key: &str, default: Option<&[u64]>) -> Result<Vec<u64>, PlanError> {
        match self.get(key) {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_u64().ok_or_else(|| self.error(key, format!("{v} is not an integer")))
                })
                .collect(),
            Some(v) => Ok(vec![v
                .as_u64()
                .ok_or_else(|| self.error(key, format!("{v} is not a list of integers")))?]),
            None => default.map(<[u64]>::to_vec).ok_or_else(|| self.error(key, "missing")),
        }
    }

    /// A list of booleans.
    pub fn bools(&self, key: &str, default: &[bool]) -> Result<Vec<bool>, PlanError> {
        match self.get(key) {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_bool().ok_or_else(|| self.error(key, format!("{v} is not a boolean")))
                })
                .collect(),
            Some(v) => Err(self.error(key, format!("{v} is not a list of booleans"))),
            None => Ok(default.to_vec()),
        }
    }

    /// `n` booleans: a list of them, or one repeated (diffusers widens a single flag); `default`
    /// repeated when absent.
    pub fn flags(&self, key: &str, n: usize, default: bool) -> Result<Vec<bool>, PlanError> {
        match self.get(key) {
            Some(Value::Bool(b)) => Ok(vec![*b; n]),
            _ => self.bools(key, &vec![default; n]),
        }
    }

    /// A list of strings.
    pub fn strings(&self, key: &str, default: &[&str]) -> Result<Vec<String>, PlanError> {
        match self.get(key) {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| self.error(key, format!("{v} is not a string")))
                })
                .collect(),
            Some(v) => Err(self.error(key, format!("{v} is not a list of strings"))),
            None => Ok(default.iter().map(|s| s.to_string()).collect()),
        }
    }

    pub fn boolean(&self, key: &str, default: bool) -> Result<bool, PlanError> {
        match self.get(key) {
            Some(v) => v.as_bool().ok_or_else(|| self.error(key, format!("{v} is not a boolean"))),
            None => Ok(default),
        }
    }

    pub fn string(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    /// The class a component's config names: diffusers' `_class_name`, transformers'
    /// `architectures[0]`.
    pub fn class(&self) -> Option<String> {
        self.string("_class_name").map(str::to_string).or_else(|| {
            self.get("architectures")?.as_array()?.first()?.as_str().map(str::to_string)
        })
    }

    /// An error about `key` of this file.
    pub fn bad(&self, key: &str, message: impl Into<String>) -> PlanError {
        self.error(key, message)
    }
}
