//! The adapter config a LoRA file carries (diffusers' `lora_adapter_metadata`: PEFT's `LoraConfig`
//! under `<component>.`), read as PEFT applies it. Options flowtune does not apply are refused by
//! name unless they hold their no-op value, so no adapter loads with a scaling it misreads.

use std::path::Path;

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::Value;

use super::LoraConfig;
use crate::ModelError;

/// The safetensors metadata key diffusers reads the adapter config from.
pub(crate) const METADATA_KEY: &str = "lora_adapter_metadata";

/// Read into [`LoraConfig`].
const APPLIED: &[&str] =
    &["r", "lora_alpha", "target_modules", "use_rslora", "rank_pattern", "alpha_pattern"];
/// Bookkeeping, training-only (dropout) or inert settings: any value loads.
const INERT: &[&str] = &[
    "peft_type",
    "peft_version",
    "task_type",
    "base_model_name_or_path",
    "revision",
    "inference_mode",
    "auto_mapping",
    "lora_dropout",
    "megatron_core",
    "qalora_group_size",
    "runtime_config",
    "ensure_weight_tying",
];
/// `init_lora_weights` values that leave the base model as it was (PiSSA, OLoRA, CorDA, LoftQ
/// and LoRA-GA rewrite it, so their adapters need a base flowtune does not have).
const BASE_PRESERVING_INITS: &[&str] = &["gaussian", "eva", "orthogonal"];

/// A metadata value, keeping the key order of an object (PEFT's patterns match first key first).
#[derive(Deserialize)]
#[serde(untagged)]
enum Field {
    Object(IndexMap<String, Value>),
    Other(Value),
}

impl Field {
    /// Whether the value is its option's no-op: null, false, 0, "", "none", [] or {}.
    fn is_unset(&self) -> bool {
        match self {
            Field::Object(map) => map.is_empty(),
            Field::Other(v) => match v {
                Value::Null => true,
                Value::Bool(b) => !b,
                Value::Number(n) => n.as_f64() == Some(0.0),
                Value::String(s) => s.is_empty() || s == "none",
                Value::Array(a) => a.is_empty(),
                Value::Object(o) => o.is_empty(),
            },
        }
    }
}

/// The metadata [`super::save`] writes: PEFT's `LoraConfig` fields flowtune applies.
pub(crate) fn metadata(config: &LoraConfig, component: &str) -> String {
    let adapter = serde_json::json!({
        format!("{component}.r"): config.rank,
        format!("{component}.lora_alpha"): config.alpha,
        format!("{component}.target_modules"): config.target_modules,
        format!("{component}.use_rslora"): config.use_rslora,
        format!("{component}.rank_pattern"): config.rank_pattern,
        format!("{component}.alpha_pattern"): config.alpha_pattern,
    });
    serde_json::to_string_pretty(&adapter).expect("JSON")
}

/// The adapter config of a LoRA file for `component`, as diffusers' `load_lora_weights` builds it:
/// from the metadata when present; otherwise the most common rank with the others in
/// `rank_pattern`, α equal to each module's rank and every adapted module a target. DoRA
/// magnitudes, LoRA biases, any option flowtune does not apply and, as in a recipe, a
/// `rank_pattern` / `alpha_pattern` key that names none of the file's adapted modules are refused
/// by name.
pub fn read_config(path: &Path, component: &str) -> Result<LoraConfig, ModelError> {
    let format = |message: String| ModelError::Format { path: path.display().to_string(), message };
    let bytes = std::fs::read(path)
        .map_err(|e| ModelError::Io { path: path.display().to_string(), message: e.to_string() })?;
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes)
        .map_err(|e| format(format!("not a safetensors file: {e}")))?;
    let tensors =
        safetensors::SafeTensors::deserialize(&bytes).map_err(|e| format(e.to_string()))?;
    let prefix = format!("{component}.");
    let mut ranks: IndexMap<String, i64> = IndexMap::new();
    let mut names: Vec<String> = tensors.names().into_iter().map(str::to_string).collect();
    names.sort();
    for name in names.iter().filter_map(|n| n.strip_prefix(&prefix)) {
        if let Some(module) = name.strip_suffix(".lora_A.weight") {
            ranks.insert(
                module.to_string(),
                tensors
                    .tensor(&format!("{prefix}{name}"))
                    .map_err(|e| format(e.to_string()))?
                    .shape()[0] as i64,
            );
        } else if name.contains("lora_magnitude_vector") {
            return Err(format(format!(
                "`{prefix}{name}` is a DoRA magnitude (use_dora): DoRA is not supported"
            )));
        } else if name.ends_with(".lora_B.bias") {
            return Err(format(format!(
                "`{prefix}{name}` is a LoRA bias (lora_bias): not supported"
            )));
        } else if !name.ends_with(".lora_B.weight") {
            return Err(format(format!("`{prefix}{name}` is not a LoRA A or B weight")));
        }
    }
    let Some(common) = most_common(&ranks) else {
        return Err(format(format!("no `{prefix}*.lora_A.weight` tensors")));
    };
    let raw = header.metadata().as_ref().and_then(|m| m.get(METADATA_KEY));
    let Some(raw) = raw else {
        let rank_pattern: IndexMap<String, i64> =
            ranks.iter().filter(|(_, &r)| r != common).map(|(m, &r)| (m.clone(), r)).collect();
        return Ok(LoraConfig {
            rank: common,
            alpha: common as f64,
            alpha_pattern: rank_pattern.iter().map(|(m, &r)| (m.clone(), r as f64)).collect(),
            rank_pattern,
            target_modules: ranks.keys().cloned().collect(),
            ..Default::default()
        });
    };
    let mut fields: IndexMap<String, Field> = serde_json::from_str::<IndexMap<String, Field>>(raw)
        .map_err(|e| format(format!("{METADATA_KEY} is not a JSON object: {e}")))?
        .into_iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(&prefix)?.to_string(), v)))
        .collect();
    for (key, value) in &fields {
        let refused = match key.as_str() {
            k if APPLIED.contains(&k) || INERT.contains(&k) => false,
            "init_lora_weights" => {
                !matches!(value, Field::Other(Value::Bool(_)))
                    && !matches!(value, Field::Other(Value::String(s)) if BASE_PRESERVING_INITS.contains(&s.as_str()))
            }
            _ => !value.is_unset(),
        };
        if refused {
            return Err(format(format!(
                "adapter option `{key}` = {} is not supported: flowtune applies r, lora_alpha, \
                 target_modules, use_rslora, rank_pattern and alpha_pattern, and loads no adapter \
                 whose math it does not reproduce",
                value.text()
            )));
        }
    }
    let mut take = |key: &str| fields.swap_remove(key);
    let bad = |key: &str, value: &Field, want: &str| {
        format(format!("adapter option `{key}` = {}: expected {want}", value.text()))
    };
    let number = |key: &str, value: Field| match &value {
        Field::Other(Value::Number(n)) => n.as_f64().ok_or_else(|| bad(key, &value, "a number")),
        _ => Err(bad(key, &value, "a number")),
    };
    let whole = |key: &str, x: f64, value: &Field| {
        if x.fract() == 0.0 {
            Ok(x as i64)
        } else {
            Err(bad(key, value, "a whole number"))
        }
    };
    let rank = match take("r") {
        Some(v) => whole("r", number("r", Field::Other(v.value()))?, &v)?,
        None => common,
    };
    let alpha =
        take("lora_alpha").map(|v| number("lora_alpha", v)).transpose()?.unwrap_or(rank as f64);
    let use_rslora = match take("use_rslora") {
        None => false,
        Some(Field::Other(Value::Bool(b))) => b,
        Some(v) => return Err(bad("use_rslora", &v, "true or false")),
    };
    let mut pattern = |key: &str| -> Result<IndexMap<String, f64>, ModelError> {
        match take(key) {
            None => Ok(IndexMap::new()),
            Some(Field::Object(map)) => map
                .into_iter()
                .map(|(k, v)| {
                    let x =
                        v.as_f64().ok_or_else(|| bad(key, &Field::Other(v.clone()), "numbers"))?;
                    Ok((k, x))
                })
                .collect(),
            Some(v) if v.is_unset() => Ok(IndexMap::new()),
            Some(v) => Err(bad(key, &v, "an object of module patterns")),
        }
    };
    let rank_pattern = pattern("rank_pattern")?
        .into_iter()
        .map(|(k, r)| Ok((k, whole("rank_pattern", r, &Field::Other(r.into()))?)))
        .collect::<Result<_, ModelError>>()?;
    let alpha_pattern = pattern("alpha_pattern")?;
    let target_modules = match take("target_modules") {
        Some(Field::Other(Value::Array(list))) if list.iter().all(Value::is_string) => {
            list.iter().filter_map(|t| t.as_str().map(str::to_string)).collect()
        }
        _ => ranks.keys().cloned().collect(),
    };
    let config = LoraConfig {
        rank,
        alpha,
        target_modules,
        use_rslora,
        rank_pattern,
        alpha_pattern,
        ..Default::default()
    };
    config.validate()?;
    let adapted: Vec<String> = ranks.into_keys().collect();
    config.check_patterns_used(&prefix, &adapted).map_err(format)?;
    Ok(config)
}

impl Field {
    fn value(&self) -> Value {
        match self {
            Field::Object(map) => serde_json::to_value(map).expect("JSON"),
            Field::Other(v) => v.clone(),
        }
    }

    fn text(&self) -> String {
        match self {
            Field::Object(map) => serde_json::to_string(map).expect("JSON"),
            Field::Other(v) => v.to_string(),
        }
    }
}

/// The rank most modules have (the first such in name order on a tie), as diffusers picks `r`.
fn most_common(ranks: &IndexMap<String, i64>) -> Option<i64> {
    let mut counts: IndexMap<i64, usize> = IndexMap::new();
    for &r in ranks.values() {
        *counts.entry(r).or_default() += 1;
    }
    let top = counts.values().copied().max()?;
    counts.into_iter().find(|&(_, n)| n == top).map(|(r, _)| r)
}
