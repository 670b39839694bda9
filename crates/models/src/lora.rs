//! LoRA adapters in the diffusers/PEFT layout: `lora_A` (r × in) and `lora_B` (out × r) beside a
//! target linear layer, output `W·x + (α/r)·B·A·x`. Adapters live in their own variable store,
//! so only they are trainable; a shared switch turns them on and off at run time (the model with
//! adapters off is the KL reference).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tch::nn::VarStore;
use tch::Tensor;

use crate::ModelError;

/// Which layers get adapters and how they start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraConfig {
    pub rank: i64,
    pub alpha: f64,
    /// Module-name suffixes, matched as PEFT does: a layer named `a.b.attn.to_q` is a target of
    /// `attn.to_q` and of `to_q`.
    pub target_modules: Vec<String>,
    pub init: LoraInit,
}

/// How adapter weights start. B is zero in both, so a fresh adapter leaves the model unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LoraInit {
    /// A ~ N(0, 1/r) (PEFT `init_lora_weights="gaussian"`).
    #[default]
    Gaussian,
    /// A ~ Kaiming-uniform (PEFT's default).
    Kaiming,
}

/// The eight SD3 attention projections flow_grpo trains.
pub const SD3_ATTENTION_TARGETS: [&str; 8] = [
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
];

impl Default for LoraConfig {
    fn default() -> Self {
        Self {
            rank: 32,
            alpha: 64.0,
            target_modules: SD3_ATTENTION_TARGETS.iter().map(|s| s.to_string()).collect(),
            init: LoraInit::Gaussian,
        }
    }
}

impl LoraConfig {
    /// Whether the layer named `module` (dotted) gets an adapter.
    pub fn targets(&self, module: &str) -> bool {
        self.target_modules.iter().any(|t| module == t || module.ends_with(&format!(".{t}")))
    }

    /// The output scale α/r.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }
}

/// Turns every adapter of a model on or off at once.
#[derive(Debug, Clone)]
pub struct AdapterSwitch(Arc<AtomicBool>);

impl Default for AdapterSwitch {
    fn default() -> Self {
        Self(Arc::new(AtomicBool::new(true)))
    }
}

impl AdapterSwitch {
    pub fn enabled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }
}

/// One adapter pair.
#[derive(Debug)]
pub struct LoraPair {
    pub a: Tensor,
    pub b: Tensor,
    pub scale: f64,
}

/// The file prefix of a component's adapters (`transformer.`) in the diffusers layout.
pub fn file_key(component: &str, variable: &str) -> String {
    format!("{component}.{variable}")
}

/// Writes the adapters of `store` as `<component>.<module>.lora_{A,B}.weight` (f32 safetensors),
/// atomically: a temporary file renamed into place.
pub fn save(store: &VarStore, component: &str, path: &Path) -> Result<(), ModelError> {
    let mut named: Vec<(String, Tensor)> = store
        .variables()
        .into_iter()
        .map(|(name, t)| {
            (file_key(component, &name), t.detach().to_kind(tch::Kind::Float).contiguous())
        })
        .collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    let tmp = path.with_extension("safetensors.tmp");
    Tensor::write_safetensors(&named, &tmp)?;
    std::fs::rename(&tmp, path)
        .map_err(|e| ModelError::Io { path: path.display().to_string(), message: e.to_string() })
}

/// Reads adapters saved by [`save`] or by diffusers/PEFT into `store`, checking names and shapes.
/// Keys for other components (another prefix) are ignored.
pub fn load(store: &mut VarStore, component: &str, path: &Path) -> Result<(), ModelError> {
    let prefix = format!("{component}.");
    let tensors = Tensor::read_safetensors(path)?;
    let mut mine = vec![];
    for (name, t) in tensors {
        if let Some(rest) = name.strip_prefix(&prefix) {
            mine.push((rest.to_string(), t));
        }
    }
    let variables = store.variables();
    let label = path.display().to_string();
    let missing: Vec<&String> =
        variables.keys().filter(|k| !mine.iter().any(|(n, _)| n == *k)).collect();
    if !missing.is_empty() {
        let names = missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ");
        return Err(ModelError::Missing { path: label, names });
    }
    let _guard = tch::no_grad_guard();
    for (name, t) in mine {
        let var = variables.get(&name).ok_or_else(|| ModelError::Unexpected {
            path: label.clone(),
            names: format!("{prefix}{name} (no such adapter with this LoRA config)"),
        })?;
        if var.size() != t.size() {
            return Err(ModelError::Shape {
                path: label,
                name,
                expected: var.size(),
                found: t.size(),
            });
        }
        var.shallow_clone().f_copy_(&t)?;
    }
    Ok(())
}
