//! A diffusers pipeline directory: `model_index.json` names the components, each in its own
//! folder with `config.json` and safetensors; and the registry of pipelines flowtune runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use flowtune_sampling::Pipeline;

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
    /// Reads `dir/model_index.json`.
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
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

    /// Whether the index declares component `name`.
    pub fn has(&self, name: &str) -> bool {
        self.index.components.contains_key(name)
    }
}

/// A pipeline family flowtune can train, keyed by diffusers' `_class_name`.
#[derive(Debug)]
pub struct PipelineEntry {
    pub class_name: &'static str,
    /// Registered algorithms this family supports.
    pub algorithms: &'static [&'static str],
    /// The pipeline whose `set_timesteps` call the sampler reproduces.
    pub schedule: Pipeline,
}

/// Every pipeline family flowtune runs.
pub const PIPELINES: &[PipelineEntry] = &[PipelineEntry {
    class_name: "StableDiffusion3Pipeline",
    algorithms: &[
        "flow_grpo",
        "dance_grpo",
        "mix_grpo",
        "grpo_guard",
        "flow_dppo",
        "dpo",
        "diffusion_nft",
    ],
    schedule: Pipeline::Sd3,
}];

/// The registered family for `(class_name, algorithm)`; errors list what is supported.
pub fn lookup(class_name: &str, algorithm: &str) -> Result<&'static PipelineEntry, ModelError> {
    let entry = PIPELINES.iter().find(|p| p.class_name == class_name).ok_or_else(|| {
        ModelError::Input(format!(
            "pipeline class `{class_name}` is not supported; supported: {}",
            PIPELINES.iter().map(|p| p.class_name).collect::<Vec<_>>().join(", ")
        ))
    })?;
    if !entry.algorithms.contains(&algorithm) {
        return Err(ModelError::Input(format!(
            "{class_name} does not support algorithm `{algorithm}`; it supports {}",
            entry.algorithms.join(", ")
        )));
    }
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_is_keyed_by_class_and_algorithm() {
        assert_eq!(
            lookup("StableDiffusion3Pipeline", "flow_grpo").unwrap().schedule,
            Pipeline::Sd3
        );
        let err = lookup("FluxPipeline", "flow_grpo").unwrap_err().to_string();
        assert!(
            err.contains("`FluxPipeline` is not supported; supported: StableDiffusion3Pipeline"),
            "{err}"
        );
        let err = lookup("StableDiffusion3Pipeline", "ppo").unwrap_err().to_string();
        assert!(err.contains("does not support algorithm `ppo`"), "{err}");
    }
}
