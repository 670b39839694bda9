//! Every recipe shipped under `examples/` resolves: known keys, valid values, and the settings
//! its algorithm needs.

use std::path::{Path, PathBuf};

use flowtune_config::Recipe;

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml") {
            out.push(path);
        }
    }
}

#[test]
fn every_example_recipe_resolves() {
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut files = vec![];
    yaml_files(&examples, &mut files);
    assert!(files.len() >= 20, "{files:?}");
    let mut algorithms = std::collections::BTreeSet::new();
    for f in &files {
        let recipe = Recipe::load(f, &[]).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        algorithms.insert(recipe.algorithm);
    }
    // A recipe for every registered algorithm.
    for a in flowtune_objectives::ALGORITHMS {
        assert!(algorithms.contains(a.name), "no recipe for {}", a.name);
    }
}
