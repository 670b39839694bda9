//! LoRA adapters in the diffusers/PEFT layout: `lora_A` (r × in) and `lora_B` (out × r) beside a
//! target linear layer, output `W·x + s·B·A·x` with PEFT's scale `s = α/r` (`α/√r` with
//! `use_rslora`), r and α per module from `rank_pattern` / `alpha_pattern` (matched as PEFT does,
//! [`flowtune_lora_match`]). Adapters live in their own variable store, so only they are
//! trainable; a shared switch turns them on and off at run time (the model with adapters off is
//! the KL reference).

use std::path::Path;

use flowtune_lora_match::Patterns;
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use tch::nn::VarStore;
use tch::{Kind, Tensor};

use crate::ModelError;

mod peft_config;

pub use flowtune_lora_match::ALL_LINEAR;
pub use peft_config::read_config;

/// Which layers get adapters and how they start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LoraConfig {
    /// Adapter rank r: the inner dimension of the A and B matrices.
    pub rank: i64,
    /// Adapter α: the update is scaled by α/r (α/√r with `use_rslora`).
    pub alpha: f64,
    /// Module-name suffixes, matched as PEFT does: a layer named `a.b.attn.to_q` is a target of
    /// `attn.to_q` and of `to_q`.
    pub target_modules: Vec<String>,
    pub init: LoraInit,
    /// PEFT's `use_rslora`: scale α/√r instead of α/r.
    pub use_rslora: bool,
    /// PEFT's `rank_pattern`: the rank of the modules a key names instead of `rank` (a key is a
    /// regular expression a module's dotted name ends with, as in PEFT; the first that matches
    /// wins); a key that names no adapted module is refused.
    pub rank_pattern: IndexMap<String, i64>,
    /// PEFT's `alpha_pattern`: the α of the modules a key names instead of `alpha`.
    pub alpha_pattern: IndexMap<String, f64>,
}

/// How adapter weights start. B is zero in both, so a fresh adapter leaves the model unchanged.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
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
            use_rslora: false,
            rank_pattern: IndexMap::new(),
            alpha_pattern: IndexMap::new(),
        }
    }
}

impl LoraConfig {
    /// Whether the layer named `module` (dotted) gets an adapter: a target names it or its
    /// dotted suffix, and PEFT's `all-linear` names every linear layer.
    pub fn targets(&self, module: &str) -> bool {
        flowtune_lora_match::targets(&self.target_modules, module)
    }

    /// The rank of the adapter on `module` (dotted name).
    pub fn rank_of(&self, module: &str) -> i64 {
        self.ranks().ok().and_then(|p| p.value_for(module)).unwrap_or(self.rank)
    }

    /// The α of the adapter on `module`.
    pub fn alpha_of(&self, module: &str) -> f64 {
        self.alphas().ok().and_then(|p| p.value_for(module)).unwrap_or(self.alpha)
    }

    fn ranks(&self) -> Result<Patterns<i64>, ModelError> {
        let pairs = self.rank_pattern.iter().map(|(k, &r)| (k, r));
        Patterns::new(pairs).map_err(|e| ModelError::Input(format!("LoRA rank_pattern {e}")))
    }

    fn alphas(&self) -> Result<Patterns<f64>, ModelError> {
        let pairs = self.alpha_pattern.iter().map(|(k, &a)| (k, a));
        Patterns::new(pairs).map_err(|e| ModelError::Input(format!("LoRA alpha_pattern {e}")))
    }

    /// The output scale of the adapter on `module`, as PEFT computes it: α/r, or α/√r with
    /// `use_rslora`.
    pub fn scale_of(&self, module: &str) -> f64 {
        let (rank, alpha) = (self.rank_of(module) as f64, self.alpha_of(module));
        if self.use_rslora {
            alpha / rank.sqrt()
        } else {
            alpha / rank
        }
    }

    /// Ranks are positive and every pattern key is a regular expression.
    pub fn validate(&self) -> Result<(), ModelError> {
        let ranks = std::iter::once(("rank".to_string(), self.rank))
            .chain(self.rank_pattern.iter().map(|(k, &r)| (format!("rank_pattern `{k}`"), r)));
        for (what, rank) in ranks {
            if rank < 1 {
                return Err(ModelError::Input(format!("LoRA {what} is {rank}; it must be ≥ 1")));
            }
        }
        self.ranks()?;
        self.alphas().map(drop)
    }

    /// Refuses a `rank_pattern` / `alpha_pattern` key that names none of the `adapted` modules (a
    /// typo would leave them at `rank` / `alpha`); `prefix` is where the keys were set
    /// (`model.lora.`).
    pub fn check_patterns_used(&self, prefix: &str, adapted: &[String]) -> Result<(), String> {
        let text = |e: ModelError| e.to_string();
        self.ranks().map_err(text)?.check_used(&format!("{prefix}rank_pattern"), adapted)?;
        self.alphas().map_err(text)?.check_used(&format!("{prefix}alpha_pattern"), adapted)
    }
}

/// Turns every adapter of a model on or off at once.
pub use crate::switch::Switch as AdapterSwitch;

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
                    // PEFT's N(0, 1/r) with the module's own rank.
                    LoraInit::Gaussian => rng.normal(&shape, device) / shape[0] as f64,
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

    /// Folds the adapters into the base weights, `W ← W + s·B·A`, and switches them off, so
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
                * self.config.scale_of(module))
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

impl LoraPair {
    /// The update `scale·B·down` in `kind`, from `down` = A·x.
    pub fn delta(&self, down: &Tensor, kind: Kind) -> Tensor {
        (down.linear::<Tensor>(&self.b, None) * self.scale).to_kind(kind)
    }
}

/// Writes the adapters of `store` as `<component>.<module>.lora_{A,B}.weight` (f32 safetensors),
/// with diffusers' `lora_adapter_metadata` (`<component>.r`, `.lora_alpha`, `.target_modules`,
/// `.use_rslora`, `.rank_pattern`, `.alpha_pattern`: PEFT's `LoraConfig`) so
/// `pipe.load_lora_weights` applies the same scales. Written to a temporary file, then renamed.
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
    let metadata = std::collections::HashMap::from([
        ("format".to_string(), "pt".to_string()),
        (peft_config::METADATA_KEY.to_string(), peft_config::metadata(config, component)),
    ]);
    let tmp = path.with_extension("safetensors.tmp");
    safetensors::serialize_to_file(views, Some(metadata), &tmp).map_err(|e| io(&e))?;
    std::fs::rename(&tmp, path).map_err(|e| io(&e))
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
