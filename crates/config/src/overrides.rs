//! `a.b.c=value` overrides applied to a parsed YAML tree, as Hydra users know them.

use serde_yaml::{Mapping, Value};

use crate::ConfigError;

/// One parsed command-line override.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// The text as given, for messages.
    pub text: String,
    /// Dotted key, split.
    pub path: Vec<String>,
    /// The value, parsed as YAML (`3`, `true`, `[0, 5]`, `null`, strings).
    pub value: Value,
}

impl Override {
    /// Parses `a.b.c=value`.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let fail =
            |message: &str| ConfigError::Override { text: text.into(), message: message.into() };
        let (key, raw) = text
            .split_once('=')
            .ok_or_else(|| fail("expected KEY=VALUE, e.g. rollout.noise_level=0.9"))?;
        let path: Vec<String> = key.trim().split('.').map(str::to_string).collect();
        if path.iter().any(|p| p.is_empty()) {
            return Err(fail("the key has an empty part"));
        }
        let value = if raw.trim().is_empty() {
            Value::Null
        } else {
            serde_yaml::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
        };
        Ok(Self { text: text.into(), path, value })
    }

    /// The dotted key.
    pub fn key(&self) -> String {
        self.path.join(".")
    }

    /// Sets the value in `tree`, creating intermediate mappings.
    pub fn apply(&self, tree: &mut Value) -> Result<(), ConfigError> {
        let mut node = tree;
        for (depth, part) in self.path.iter().enumerate() {
            if node.is_null() {
                *node = Value::Mapping(Mapping::new());
            }
            let Value::Mapping(map) = node else {
                return Err(ConfigError::Override {
                    text: self.text.clone(),
                    message: format!("`{}` is not a section", self.path[..depth].join(".")),
                });
            };
            let key = Value::String(part.clone());
            if depth + 1 == self.path.len() {
                map.insert(key, self.value.clone());
                return Ok(());
            }
            node = map.entry(key).or_insert(Value::Null);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_values_as_yaml() {
        let o = Override::parse("rollout.sde_window_range=[0, 5]").unwrap();
        assert_eq!(o.path, ["rollout", "sde_window_range"]);
        assert_eq!(o.value, serde_yaml::from_str::<Value>("[0, 5]").unwrap());
        assert_eq!(Override::parse("a=true").unwrap().value, Value::Bool(true));
        assert_eq!(Override::parse("a=").unwrap().value, Value::Null);
        assert_eq!(Override::parse("a=x: [").unwrap().value, Value::String("x: [".into()));
        assert!(Override::parse("novalue").is_err());
        assert!(Override::parse("a..b=1").is_err());
    }

    #[test]
    fn applies_into_nested_sections() {
        let mut tree: Value = serde_yaml::from_str("rollout: {steps: 10}").unwrap();
        Override::parse("rollout.steps=4").unwrap().apply(&mut tree).unwrap();
        Override::parse("actor.clip_ratio=1e-5").unwrap().apply(&mut tree).unwrap();
        assert_eq!(tree["rollout"]["steps"], Value::from(4));
        assert_eq!(tree["actor"]["clip_ratio"], Value::from(1e-5));
        let err = Override::parse("rollout.steps.x=1").unwrap().apply(&mut tree).unwrap_err();
        assert!(err.to_string().contains("`rollout.steps` is not a section"), "{err}");
    }
}
