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

/// FLUX.1's default LoRA targets: attention projections of both streams (the single blocks'
/// `attn.to_q/k/v` too), the single blocks' `proj_mlp` and `proj_out` (PEFT's suffix match also
/// adapts the top-level `proj_out`). flow_grpo's Flux recipes adapt the double blocks'
/// feed-forwards instead of `proj_mlp` / `proj_out` (`examples/*_flux.yaml`).
pub const FLUX_TARGETS: [&str; 10] = [
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
    "proj_mlp",
    "proj_out",
];

/// PEFT's target that adapts every linear layer of the model.
pub const ALL_LINEAR: &str = "all-linear";

/// Qwen-Image's LoRA targets in the reference recipes: attention projections of both streams
/// and both feed-forwards.
pub const QWEN_IMAGE_TARGETS: [&str; 12] = [
    "to_q",
    "to_k",
    "to_v",
    "to_out.0",
    "add_q_proj",
    "add_k_proj",
    "add_v_proj",
    "to_add_out",
    "img_mlp.net.0.proj",
    "img_mlp.net.2",
    "txt_mlp.net.0.proj",
    "txt_mlp.net.2",
];

/// Wan's LoRA targets as PEFT users name them (DiffSynth / diffusers Wan LoRA recipes): both
/// attentions' projections and the feed-forward of every block.
pub const WAN_TARGETS: [&str; 10] = [
    "attn1.to_q",
    "attn1.to_k",
    "attn1.to_v",
    "attn1.to_out.0",
    "attn2.to_q",
    "attn2.to_k",
    "attn2.to_v",
    "attn2.to_out.0",
    "ffn.net.0.proj",
    "ffn.net.2",
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
    /// Whether the layer named `module` (dotted) gets an adapter: a target names it or its
    /// dotted suffix, and PEFT's `all-linear` names every linear layer.
    pub fn targets(&self, module: &str) -> bool {
        self.target_modules
            .iter()
            .any(|t| t == ALL_LINEAR || module == t || module.ends_with(&format!(".{t}")))
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

/// A model's adapters: their weights (the only trainable variables), switch and config.
#[derive(Debug)]
pub struct Adapters {
    pub store: VarStore,
    pub switch: AdapterSwitch,
    pub config: LoraConfig,
}

impl Adapters {
    /// Fresh adapter weights from `seed`: A per `config.init`, B = 0 (so the model is unchanged).
    pub fn initialize(&self, seed: u64) -> Result<(), ModelError> {
        let mut rng = flowtune_sampling::SampleRng::new(seed);
        let mut vars: Vec<(String, Tensor)> = self.store.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let _guard = tch::no_grad_guard();
        for (name, var) in vars {
            let value = if name.ends_with(".lora_A.weight") {
                let (shape, device) = (var.size(), var.device());
                match self.config.init {
                    LoraInit::Gaussian => rng.normal(&shape, device) / self.config.rank as f64,
                    // Kaiming-uniform with a = √5: U(±1/√fan_in), as nn.Linear and PEFT.
                    LoraInit::Kaiming => {
                        rng.uniform(&shape, device) * (2.0 / (shape[1] as f64).sqrt())
                            - 1.0 / (shape[1] as f64).sqrt()
                    }
                }
            } else {
                var.zeros_like()
            };
            var.shallow_clone().f_copy_(&value)?;
        }
        Ok(())
    }

    /// Folds the adapters into the base weights, `W ← W + (α/r)·B·A`, and switches them off, so
    /// the base model alone computes what base + adapters did (for export).
    pub fn merge_into(&self, base: &VarStore) -> Result<(), ModelError> {
        let adapters = self.store.variables();
        let weights = base.variables();
        let _guard = tch::no_grad_guard();
        for (name, a) in &adapters {
            let Some(module) = name.strip_suffix(".lora_A.weight") else { continue };
            let b = &adapters[&format!("{module}.lora_B.weight")];
            let w = weights.get(&format!("{module}.weight")).ok_or_else(|| {
                ModelError::Missing { path: "base model".into(), names: format!("{module}.weight") }
            })?;
            let delta = (b.to_kind(tch::Kind::Float).matmul(&a.to_kind(tch::Kind::Float))
                * self.config.scale())
            .to_kind(w.kind());
            let _ = w.shallow_clone().f_add_(&delta)?;
        }
        self.switch.set(false);
        Ok(())
    }
}

/// One adapter pair.
#[derive(Debug)]
pub struct LoraPair {
    pub a: Tensor,
    pub b: Tensor,
    pub scale: f64,
}

/// The safetensors metadata key diffusers reads the adapter config from.
const METADATA_KEY: &str = "lora_adapter_metadata";

/// Writes the adapters of `store` as `<component>.<module>.lora_{A,B}.weight` (f32 safetensors),
/// with diffusers' `lora_adapter_metadata` (`<component>.r`, `.lora_alpha`, `.target_modules`) so
/// `pipe.load_lora_weights` applies the same α/r. Written to a temporary file, then renamed.
pub fn save(
    store: &VarStore,
    config: &LoraConfig,
    component: &str,
    path: &Path,
) -> Result<(), ModelError> {
    let io = |e: &dyn std::fmt::Display| ModelError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let mut named: Vec<(String, Vec<usize>, Vec<u8>)> = vec![];
    for (name, t) in store.variables() {
        let t = t.detach().to_kind(tch::Kind::Float).to_device(tch::Device::Cpu).contiguous();
        let values = Vec::<f32>::try_from(t.flatten(0, -1))?;
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        named.push((
            format!("{component}.{name}"),
            t.size().iter().map(|&d| d as usize).collect(),
            bytes,
        ));
    }
    named.sort_by(|a, b| a.0.cmp(&b.0));
    let views = named
        .iter()
        .map(|(n, shape, bytes)| {
            Ok((
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                    .map_err(|e| io(&e))?,
            ))
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    let adapter = serde_json::json!({
        format!("{component}.r"): config.rank,
        format!("{component}.lora_alpha"): config.alpha,
        format!("{component}.target_modules"): config.target_modules,
    });
    let metadata = std::collections::HashMap::from([
        ("format".to_string(), "pt".to_string()),
        (METADATA_KEY.to_string(), serde_json::to_string_pretty(&adapter).expect("JSON")),
    ]);
    let tmp = path.with_extension("safetensors.tmp");
    safetensors::serialize_to_file(views, Some(metadata), &tmp).map_err(|e| io(&e))?;
    std::fs::rename(&tmp, path).map_err(|e| io(&e))
}

/// The adapter config of a LoRA file: rank from the tensors, α and targets from diffusers'
/// metadata when present (else α = r and every adapted module as a target).
pub fn read_config(path: &Path, component: &str) -> Result<LoraConfig, ModelError> {
    let format = |message: String| ModelError::Format { path: path.display().to_string(), message };
    let bytes = std::fs::read(path)
        .map_err(|e| ModelError::Io { path: path.display().to_string(), message: e.to_string() })?;
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes)
        .map_err(|e| format(format!("not a safetensors file: {e}")))?;
    let tensors =
        safetensors::SafeTensors::deserialize(&bytes).map_err(|e| format(e.to_string()))?;
    let prefix = format!("{component}.");
    let mut rank = None;
    let mut modules = vec![];
    for (name, view) in tensors.tensors() {
        if let Some(module) =
            name.strip_prefix(&prefix).and_then(|n| n.strip_suffix(".lora_A.weight"))
        {
            rank = Some(view.shape()[0] as i64);
            modules.push(module.to_string());
        }
    }
    let rank = rank.ok_or_else(|| format(format!("no `{prefix}*.lora_A.weight` tensors")))?;
    let meta: Option<serde_json::Value> = header
        .metadata()
        .as_ref()
        .and_then(|m| m.get(METADATA_KEY))
        .and_then(|raw| serde_json::from_str(raw).ok());
    let field =
        |key: &str| meta.as_ref().and_then(|m| m.get(format!("{component}.{key}")).cloned());
    let alpha = field("lora_alpha").and_then(|v| v.as_f64()).unwrap_or(rank as f64);
    let target_modules = field("target_modules")
        .and_then(|v| serde_json::from_value::<Vec<String>>(v).ok())
        .unwrap_or(modules);
    Ok(LoraConfig { rank, alpha, target_modules, ..Default::default() })
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
