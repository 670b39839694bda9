//! PEFT's per-module `rank_pattern` / `alpha_pattern`: each key is a regular expression that
//! names a module when the module's dotted name ends with it at a dot (`(.*\.)?(key)$`, matched
//! from the start); the first key in the map's order that names the module gives its value.

use indexmap::IndexMap;
use regex::Regex;

use crate::ModelError;

/// The regular expression PEFT's `get_pattern_key` matches `key` with.
fn pattern(key: &str) -> Result<Regex, regex::Error> {
    Regex::new(&format!(r"^(?:.*\.)?(?:{key})$"))
}

/// The value of the first key of `patterns` that names `module`.
pub(crate) fn value_for<T: Copy>(patterns: &IndexMap<String, T>, module: &str) -> Option<T> {
    patterns
        .iter()
        .find_map(|(key, &value)| pattern(key).ok().filter(|re| re.is_match(module)).map(|_| value))
}

/// Every key compiles; `what` names the recipe / config key in the error.
pub(crate) fn check<T>(patterns: &IndexMap<String, T>, what: &str) -> Result<(), ModelError> {
    for key in patterns.keys() {
        pattern(key).map_err(|e| {
            ModelError::Input(format!("LoRA {what} key `{key}` is not a regular expression: {e}"))
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_dotted_name_ends_first_key_first() {
        let p: IndexMap<String, i64> =
            [("to_k".into(), 2), ("layers.0.attention.to_q".into(), 3), ("to_.".into(), 5)]
                .into_iter()
                .collect();
        assert_eq!(value_for(&p, "layers.1.attention.to_k"), Some(2));
        assert_eq!(value_for(&p, "to_k"), Some(2));
        assert_eq!(value_for(&p, "layers.0.attention.to_q"), Some(3));
        assert_eq!(value_for(&p, "layers.1.attention.to_q"), Some(5));
        assert_eq!(value_for(&p, "layers.1.attention.add_k"), None);
        assert_eq!(value_for(&p, "layers.1.attention.xto_k"), None);
        let bad: IndexMap<String, i64> = [("to_(q".into(), 2)].into_iter().collect();
        assert!(check(&bad, "rank_pattern").unwrap_err().to_string().contains("`to_(q`"));
    }
}
