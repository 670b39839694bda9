//! PEFT's LoRA module matching, torch-free so that the models and the planner (`flowtune plan`)
//! decide alike: which layers `target_modules` adapts, and the rank or α a `rank_pattern` /
//! `alpha_pattern` key gives them.

use std::collections::BTreeSet;

use regex::Regex;

/// PEFT's target that adapts every linear layer.
pub const ALL_LINEAR: &str = "all-linear";

/// Whether `target_modules` adapts the layer named `module` (dotted): a target equals the name or
/// its dotted suffix (`attn.to_q` and `to_q` name `blocks.0.attn.to_q`), `all-linear` every layer.
pub fn targets(target_modules: &[String], module: &str) -> bool {
    target_modules
        .iter()
        .any(|t| t == ALL_LINEAR || module == t || module.ends_with(&format!(".{t}")))
}

/// Refuses the first of `target_modules` that adapts none of the `adapted` layers, as PEFT does,
/// naming `setting`, the target and the endings of the model's `linear` layers (dotted names)
/// nearest it.
pub fn check_targets_used(
    setting: &str,
    target_modules: &[String],
    adapted: &[String],
    linear: &[String],
) -> Result<(), String> {
    let unused = target_modules
        .iter()
        .find(|t| *t != ALL_LINEAR && !adapted.iter().any(|m| targets(std::slice::from_ref(t), m)));
    let Some(target) = unused else { return Ok(()) };
    Err(format!(
        "{setting} entry `{target}` names none of the model's {} linear layers (a target is a \
         layer's dotted name or its ending); nearest: {}",
        linear.len(),
        nearest(target, linear).join(", ")
    ))
}

/// A compiled `rank_pattern` or `alpha_pattern`: each key is a regular expression that names a
/// module when the module's dotted name ends with it at a dot (`(.*\.)?(key)$`, matched from the
/// start); the first key in order that names a module gives its value.
#[derive(Debug, Clone)]
pub struct Patterns<T>(Vec<(String, Regex, T)>);

impl<T> Default for Patterns<T> {
    fn default() -> Self {
        Self(vec![])
    }
}

impl<T: Copy> Patterns<T> {
    /// The `(key, value)` pairs in order; a key that is not a regular expression is refused by
    /// name.
    pub fn new<K: AsRef<str>>(pairs: impl IntoIterator<Item = (K, T)>) -> Result<Self, String> {
        let compile = |(key, value): (K, T)| {
            let key = key.as_ref();
            match Regex::new(&format!(r"^(?:.*\.)?(?:{key})$")) {
                Ok(re) => Ok((key.to_string(), re, value)),
                Err(e) => Err(format!("key `{key}` is not a regular expression: {e}")),
            }
        };
        pairs.into_iter().map(compile).collect::<Result<_, _>>().map(Self)
    }

    /// The value of the first key that names `module`.
    pub fn value_for(&self, module: &str) -> Option<T> {
        self.0.iter().find(|(_, re, _)| re.is_match(module)).map(|&(_, _, value)| value)
    }

    /// Refuses the first key that names none of the `adapted` modules, which would silently leave
    /// them all at the default; the message names `setting`, the key and the endings of adapted
    /// names nearest it.
    pub fn check_used(&self, setting: &str, adapted: &[String]) -> Result<(), String> {
        let unused = self.0.iter().find(|(_, re, _)| !adapted.iter().any(|m| re.is_match(m)));
        let Some((key, ..)) = unused else { return Ok(()) };
        Err(format!(
            "{setting} key `{key}` names none of the {} modules the LoRA adapts (a key matches \
             the end of a dotted module name); nearest: {}",
            adapted.len(),
            nearest(key, adapted).join(", ")
        ))
    }
}

/// The three dotted endings of `modules` nearest `key`: by edit distance to their first as many
/// characters as `key` has, then shortest.
fn nearest(key: &str, modules: &[String]) -> Vec<String> {
    let endings: BTreeSet<&str> = modules
        .iter()
        .flat_map(|m| {
            std::iter::once(m.as_str()).chain(m.match_indices('.').map(|(i, _)| &m[i + 1..]))
        })
        .collect();
    let mut scored: Vec<(usize, usize, &str)> = endings
        .into_iter()
        .map(|e| {
            let head = e.char_indices().nth(key.chars().count()).map_or(e, |(i, _)| &e[..i]);
            (strsim::levenshtein(key, head), e.len(), e)
        })
        .collect();
    scored.sort_unstable();
    scored.into_iter().take(3).map(|(.., e)| format!("`{e}`")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_that_adapts_nothing_is_refused_with_the_nearest_layers() {
        let linear: Vec<String> =
            ["blocks.0.attn.to_q", "blocks.0.attn.to_k", "proj_out"].map(String::from).to_vec();
        let ok = ["to_q".to_string(), "attn.to_k".into(), ALL_LINEAR.into()];
        let setting = "model.lora.target_modules";
        assert!(check_targets_used(setting, &ok, &linear, &linear).is_ok());
        let typo = ["to_q".to_string(), "to_qq".into()];
        let err = check_targets_used(setting, &typo, &linear, &linear).unwrap_err();
        assert!(
            err.starts_with(
                "model.lora.target_modules entry `to_qq` names none of the model's 3 linear layers"
            ),
            "{err}"
        );
        assert!(err.contains("nearest: `to_q`"), "{err}");
    }

    #[test]
    fn keys_match_dotted_name_ends_first_key_first() {
        let pairs = [("to_k", 2), ("layers.0.attention.to_q", 3), ("to_.", 5)];
        let p = Patterns::new(pairs).unwrap();
        assert_eq!(p.value_for("layers.1.attention.to_k"), Some(2));
        assert_eq!(p.value_for("to_k"), Some(2));
        assert_eq!(p.value_for("layers.0.attention.to_q"), Some(3));
        assert_eq!(p.value_for("layers.1.attention.to_q"), Some(5));
        assert_eq!(p.value_for("layers.1.attention.add_k"), None);
        assert_eq!(p.value_for("layers.1.attention.xto_k"), None);
        let bad = Patterns::new([("to_(q", 2)]).unwrap_err();
        assert!(bad.starts_with("key `to_(q` is not a regular expression"), "{bad}");
    }

    #[test]
    fn targets_are_names_or_dotted_suffixes() {
        let t = vec!["attn.to_q".to_string(), "net.2".to_string()];
        assert!(targets(&t, "blocks.0.attn.to_q") && targets(&t, "ff.net.2"));
        assert!(!targets(&t, "blocks.0.attn.add_to_q") && !targets(&t, "net.20"));
        assert!(targets(&[ALL_LINEAR.to_string()], "proj_out"));
    }

    #[test]
    fn a_key_naming_no_adapted_module_is_refused_with_the_nearest_endings() {
        let adapted: Vec<String> = (0..2)
            .flat_map(|b| ["to_q", "to_k", "to_v"].map(|n| format!("blocks.{b}.attn.{n}")))
            .collect();
        let used = Patterns::new([("attn.to_k", 4), ("blocks.1.attn.to_.", 8)]).unwrap();
        assert!(used.check_used("model.lora.rank_pattern", &adapted).is_ok());
        let prefix = Patterns::new([("blocks", 4)]).unwrap();
        let err = prefix.check_used("model.lora.alpha_pattern", &adapted).unwrap_err();
        assert!(
            err.ends_with(
                "nearest: `blocks.0.attn.to_k`, `blocks.0.attn.to_q`, `blocks.0.attn.to_v`"
            ),
            "{err}"
        );
        let typo = Patterns::new([("to_k", 4), ("attn.to_kk", 8)]).unwrap();
        let err = typo.check_used("model.lora.rank_pattern", &adapted).unwrap_err();
        assert_eq!(
            err,
            "model.lora.rank_pattern key `attn.to_kk` names none of the 6 modules the LoRA adapts \
             (a key matches the end of a dotted module name); nearest: `attn.to_k`, `attn.to_q`, \
             `attn.to_v`"
        );
    }
}
