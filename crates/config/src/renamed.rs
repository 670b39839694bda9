//! Keys that moved: an algorithm's knobs live in its own section of `actor` (`actor.dgpo.beta`,
//! once `actor.dgpo_beta`). Recipes and overrides with the old flat keys still load: each old key
//! is read as its new one, in the file before the overrides and in every override alone, so the
//! later setting wins whichever spelling each uses.

use serde_yaml::{Mapping, Value};

/// (old key, new key), dotted.
pub const RENAMED: &[(&str, &str)] = &[
    ("actor.dpo_beta", "actor.dpo.beta"),
    ("actor.mix_beta", "actor.nft.beta"),
    ("actor.reward_mode", "actor.nft.reward_mode"),
    ("actor.dgpo_beta", "actor.dgpo.beta"),
    ("actor.dgpo_clip_range", "actor.dgpo.clip_range"),
    ("actor.train_timestep_range", "actor.dgpo.train_timestep_range"),
    ("actor.train_timestep_count", "actor.dgpo.train_timestep_count"),
    ("actor.gardo_kl_threshold", "actor.gardo.kl_threshold"),
    ("actor.gardo_reset_interval", "actor.gardo.reset_interval"),
    ("actor.gardo_proxy_rewards", "actor.gardo.proxy_rewards"),
    ("actor.gardo_features", "actor.gardo.features"),
];

/// The new path of an override's dotted `path`, when it names an old key.
pub(crate) fn renamed_path(path: &[String]) -> Option<Vec<String>> {
    let key = path.join(".");
    let (_, new) = RENAMED.iter().find(|(old, _)| *old == key)?;
    Some(new.split('.').map(str::to_string).collect())
}

/// Moves every old key of the recipe tree `tree` to its new place (a new key set beside it in
/// the same file wins); says whether anything moved.
pub(crate) fn migrate(tree: &mut Value) -> bool {
    let mut moved = false;
    for (old, new) in RENAMED {
        let (old, new): (Vec<&str>, Vec<&str>) =
            (old.split('.').collect(), new.split('.').collect());
        let Some(section) = mapping_at(tree, &old[..old.len() - 1]) else { continue };
        let Some(value) = section.remove(old[old.len() - 1]) else { continue };
        moved = true;
        insert_new(section, &new[old.len() - 1..], value);
    }
    moved
}

/// Sets `path` under `map` to `value` unless it is set already, making the sections on the way
/// (where a part is a value, not a section, the recipe's own check names it).
fn insert_new(map: &mut Mapping, path: &[&str], value: Value) {
    let key = Value::from(path[0]);
    if path.len() == 1 {
        map.entry(key).or_insert(value);
        return;
    }
    let entry = map.entry(key).or_insert(Value::Null);
    if entry.is_null() {
        *entry = Mapping::new().into();
    }
    if let Value::Mapping(next) = entry {
        insert_new(next, &path[1..], value);
    }
}

/// The mapping at `path` in `tree`, if every part of it is one.
fn mapping_at<'a>(tree: &'a mut Value, path: &[&str]) -> Option<&'a mut Mapping> {
    let mut node = tree;
    for part in path {
        node = node.as_mapping_mut()?.get_mut(*part)?;
    }
    node.as_mapping_mut()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_keys_move_into_their_sections_and_new_keys_win() {
        let mut tree: Value = serde_yaml::from_str(
            "actor:\n  dgpo_beta: 50\n  gardo_features: clip\n  dgpo: {clip_range: 0.02}\n  nft: {beta: 0.7}\n  mix_beta: 0.3\n",
        )
        .unwrap();
        assert!(migrate(&mut tree));
        let actor = &tree["actor"];
        assert_eq!(actor["dgpo"]["beta"], Value::from(50));
        assert_eq!(actor["dgpo"]["clip_range"], Value::from(0.02));
        assert_eq!(actor["gardo"]["features"], Value::from("clip"));
        assert_eq!(actor["nft"]["beta"], Value::from(0.7));
        assert!(actor.get("dgpo_beta").is_none() && actor.get("mix_beta").is_none());
        assert!(!migrate(&mut tree));
        let path = ["actor".to_string(), "train_timestep_range".to_string()];
        assert_eq!(renamed_path(&path).unwrap().join("."), "actor.dgpo.train_timestep_range");
        assert!(renamed_path(&["actor".into(), "clip_ratio".into()]).is_none());
    }
}
