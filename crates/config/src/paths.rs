//! Where relative paths lead. In a recipe file, an input's relative path (model, teachers, data,
//! reward model files, certificates) is taken from the file's folder, so a recipe and what it
//! ships with move together. The run's own folders (`trainer.output_dir`, `trainer.resume`) and
//! every path given as a command-line override are taken from the working directory.

use std::path::Path;

use serde_yaml::Value;

/// The input paths of a recipe, as dotted keys; `*` stands for every item of a list (and
/// `reward.functions.*.vlm.model` under `backend: native`, in [`rebase`]).
const INPUTS: &[&str] = &[
    "model.path",
    "model.teacher_path",
    "model.teachers.*.path",
    "data.train_files.*",
    "data.val_files.*",
    "data.preference_files.*",
    "actor.gardo.features",
    "reward.functions.*.http.ca_file",
    "reward.functions.*.ocr.models",
    "reward.functions.*.ocr.runtime",
    "reward.functions.*.clip.model",
    "reward.functions.*.clip.head",
    "reward.functions.*.clip.tokenizer",
    "reward.functions.*.hpsv3.model",
];

/// Keys that may name a Hugging Face Hub id (`owner/name`) in the local cache instead.
const PIPELINES: &[&str] = &[
    "model.path",
    "model.teacher_path",
    "model.teachers.*.path",
    "reward.functions.*.hpsv3.model",
];

/// Takes every relative input path of the recipe tree `tree` (read from a file in `base`) from
/// `base`. A pipeline key keeps its text when it reads as a Hub id and `base` holds no such folder.
pub(crate) fn rebase(tree: &mut Value, base: &Path) {
    if base.as_os_str().is_empty() {
        return;
    }
    for key in INPUTS {
        let parts: Vec<&str> = key.split('.').collect();
        let hub = PIPELINES.contains(key);
        visit(tree, &parts, &mut |value| rebase_one(value, base, hub));
    }
    // A judge's `vlm.model` is a folder (or Hub id) only when it runs in this process; a served
    // model's name stays as written.
    visit(tree, &["reward", "functions", "*", "vlm"], &mut |vlm| {
        if vlm.get("backend").and_then(Value::as_str) == Some("native") {
            if let Some(model) = vlm.get_mut("model") {
                rebase_one(model, base, true);
            }
        }
    });
}

fn visit(node: &mut Value, parts: &[&str], f: &mut impl FnMut(&mut Value)) {
    let Some((first, rest)) = parts.split_first() else {
        return f(node);
    };
    match (node, *first) {
        (Value::Sequence(items), "*") => items.iter_mut().for_each(|item| visit(item, rest, f)),
        (Value::Mapping(map), key) => {
            if let Some(child) = map.get_mut(key) {
                visit(child, rest, f);
            }
        }
        _ => {}
    }
}

fn rebase_one(value: &mut Value, base: &Path, hub: bool) {
    let Value::String(text) = value else { return };
    let path = Path::new(text.as_str());
    if text.is_empty() || path.is_absolute() {
        return;
    }
    let joined = base.join(path);
    if hub && !joined.exists() && flowtune_models::hub::reads_as_hub_id(text) {
        return;
    }
    *text = joined.to_string_lossy().into_owned();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rebased(yaml: &str, base: &Path) -> Value {
        let mut tree: Value = serde_yaml::from_str(yaml).unwrap();
        rebase(&mut tree, base);
        tree
    }

    #[test]
    fn inputs_follow_the_recipe_folder_and_outputs_stay() {
        let tree = rebased(
            "model: {path: ../models/x, teachers: [{path: t1}, {path: /abs/t2}]}\n\
             data: {train_files: [p.txt, /abs/q.txt], val_files: [v.jsonl]}\n\
             reward: {functions: [{name: ocr, ocr: {models: m}}, {name: http, http: {ca_file: ca.pem}}]}\n\
             trainer: {output_dir: runs/x, resume: runs/x/checkpoints/step_000002}\n",
            Path::new("recipes"),
        );
        assert_eq!(tree["model"]["path"], Value::from("recipes/../models/x"));
        assert_eq!(tree["model"]["teachers"][0]["path"], Value::from("recipes/t1"));
        assert_eq!(tree["model"]["teachers"][1]["path"], Value::from("/abs/t2"));
        assert_eq!(tree["data"]["train_files"][0], Value::from("recipes/p.txt"));
        assert_eq!(tree["data"]["train_files"][1], Value::from("/abs/q.txt"));
        assert_eq!(tree["data"]["val_files"][0], Value::from("recipes/v.jsonl"));
        let functions = &tree["reward"]["functions"];
        assert_eq!(functions[0]["ocr"]["models"], Value::from("recipes/m"));
        assert_eq!(functions[1]["http"]["ca_file"], Value::from("recipes/ca.pem"));
        assert_eq!(tree["trainer"]["output_dir"], Value::from("runs/x"), "outputs: working dir");
        assert_eq!(tree["trainer"]["resume"], Value::from("runs/x/checkpoints/step_000002"));
        let judges = rebased(
            "reward: {functions: [{name: vlm_judge, vlm: {backend: native, model: judge_vl}},\n\
             {name: vlm_judge, vlm: {backend: native, model: Qwen/Qwen3-VL-8B-Instruct}},\n\
             {name: vlm_judge, url: 'http://127.0.0.1:1/v1/chat/completions', vlm: {model: served}}]}",
            Path::new("recipes"),
        );
        let judges = &judges["reward"]["functions"];
        assert_eq!(judges[0]["vlm"]["model"], Value::from("recipes/judge_vl"), "a native folder");
        assert_eq!(judges[1]["vlm"]["model"], Value::from("Qwen/Qwen3-VL-8B-Instruct"), "a Hub id");
        assert_eq!(judges[2]["vlm"]["model"], Value::from("served"), "a served model's name");
        let same = rebased("data: {train_files: [p.txt]}", Path::new(""));
        assert_eq!(same["data"]["train_files"][0], Value::from("p.txt"), "a recipe in the cwd");
    }

    #[test]
    fn a_hub_id_stays_unless_the_recipe_folder_holds_it() {
        let dir = std::env::temp_dir().join(format!("flowtune-paths-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("local/model")).unwrap();
        let tree = rebased(
            "model: {path: Qwen/Qwen-Image, teacher_path: local/model}\n\
             data: {train_files: [Qwen/Qwen-Image]}\n",
            &dir,
        );
        assert_eq!(tree["model"]["path"], Value::from("Qwen/Qwen-Image"));
        let local = dir.join("local/model").display().to_string();
        assert_eq!(tree["model"]["teacher_path"], Value::from(local), "an existing folder wins");
        let data = dir.join("Qwen/Qwen-Image").display().to_string();
        assert_eq!(tree["data"]["train_files"][0], Value::from(data), "data is never a Hub id");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
