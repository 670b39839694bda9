//! The README's commands are the ones that run here. The tests read README.md, take its fenced
//! blocks and run them as written, but for the stand-ins and skips listed at the top: the CPU
//! tour in order, the 8-GPU section on tiny stand-ins (2 CPU ranks, a Hub-cache layout), and the
//! diffusers snippet on the LoRA that run wrote. A last test checks the README itself.

mod common;

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use common::{root, stdout};
use flowtune_fixtures::scratch;

/// How the commands run here. Every working directory is a scratch folder with `examples`
/// linked to the repository's, so the README's relative paths (`examples/…`, `runs/…`) work.
/// `/tmp/…` in a command (and a recipe's `model.path` there) moves into the scratch folder:
/// concurrent test runs would otherwise share `/tmp/flowtune-tiny-*`.
const TMP: &str = "/tmp/";

/// Appended to `flowtune demo`: its 140 steps take about 10 minutes; one step, validated with 2
/// denoising steps, still writes every picture and `summary.json`.
const DEMO_SHORT: &[&str] = &["trainer.total_steps=1", "rollout.eval_steps=2"];

/// The training lines of "Train Qwen-Image on 8 GPUs": (README text, here, why). `plan` runs as
/// written on the real recipe: it reads configs only, and the Hub cache it sees holds the
/// real-size ones (`examples/models/qwen-image`); training sees a tiny Qwen-Image pipeline as
/// `Qwen/Qwen-Image` in its cache. Each training line also gets the real recipe's
/// `trainer.output_dir` (the stand-in writes where the real one does) and the k-th
/// `trainer.total_steps=k`: one step each, every line resuming the one before ("Resume"). The
/// torchrun line takes the launch line's overrides, as its comment says.
const GPU_STAND_INS: &[(&str, &str, &str)] = &[
    (
        "examples/flow_grpo_qwen_image.yaml",
        "examples/flow_grpo_qwen_image_tiny.yaml",
        "20B weights do not train on 2 CPU cores",
    ),
    ("--device cuda", "--device cpu", "no GPU here"),
    ("--nproc 8", "--nproc 2", "2 CPU ranks"),
    ("--nproc-per-node 8", "--standalone --nproc-per-node 2", "2 CPU ranks, a free port"),
];

/// The Hub id the 8-GPU section trains, resolved through `HF_HUB_CACHE`.
const HUB_ID: &str = "Qwen/Qwen-Image";

/// README commands not run: (how the command starts, why). Also skipped, with the reason printed:
/// the single-node torchrun line where torchrun is not on `PATH`, and the Python snippet where
/// the project's venv has no diffusers (`scripts/setup-anchors.sh`).
const SKIPPED: &[(&str, &str)] = &[
    ("huggingface-cli download", "network; the Hub-cache stand-in holds a tiny pipeline"),
    ("git clone", "network; the tiny recipe's prompts stand in for flow_grpo's"),
    ("mkdir -p data/ocr", "copies the cloned prompts"),
    ("torchrun --nnodes", "needs 4 machines and a rendezvous host node01"),
    ("srun", "needs a Slurm allocation"),
];

/// The Python snippet's stand-ins: (README text, here, why). `Qwen/Qwen-Image` stays: diffusers
/// finds the tiny pipeline in the same Hub cache (`HF_HUB_OFFLINE=1`).
const SNIPPET_STAND_INS: &[(&str, &str, &str)] = &[
    ("torch.bfloat16", "torch.float32", "the CPU"),
    ("\"cuda\"", "\"cpu\"", "no GPU here"),
    ("width=512, height=512", "width=64, height=64", "the tiny pipeline"),
    ("num_inference_steps=50", "num_inference_steps=2", "seconds, not minutes"),
];

/// The README, read at test time.
fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).unwrap()
}

/// The text under `## <title>`, to the next `## ` heading.
fn section(readme: &str, title: &str) -> String {
    let head = format!("## {title}\n");
    let start = readme.find(&head).unwrap_or_else(|| panic!("README has no `{head}`")) + head.len();
    let rest = &readme[start..];
    rest[..rest.find("\n## ").unwrap_or(rest.len())].to_string()
}

/// The fenced blocks of language `lang` in `text`.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let (mut out, mut current): (Vec<String>, Option<String>) = (vec![], None);
    for line in text.lines() {
        match (&mut current, line.strip_prefix("```")) {
            (None, Some(tag)) if tag.trim() == lang => current = Some(String::new()),
            (Some(block), Some("")) => {
                out.push(std::mem::take(block));
                current = None;
            }
            (Some(block), _) => block.push_str(&format!("{line}\n")),
            _ => {}
        }
    }
    out
}

/// The commands of the bash blocks in `text`, as words: `\` continuations joined, comments
/// dropped, blank lines skipped.
fn commands(text: &str) -> Vec<Vec<String>> {
    let joined = blocks(text, "bash").concat().replace("\\\n", " ");
    joined
        .lines()
        .map(|line| {
            let words = line.split_whitespace().take_while(|w| !w.starts_with('#'));
            words.map(String::from).collect::<Vec<_>>()
        })
        .filter(|words| !words.is_empty())
        .collect()
}

/// The reason a command is not run, if it is one of [`SKIPPED`].
fn skipped(words: &[String]) -> Option<&'static str> {
    let line = words.join(" ");
    SKIPPED.iter().find(|(start, _)| line.starts_with(start)).map(|(_, why)| *why)
}

/// `words` with each word-bounded `(from, to, _)` of `table` replaced.
fn substitute(words: &[String], table: &[(&str, &str, &str)]) -> Vec<String> {
    let mut line = format!(" {} ", words.join(" "));
    for (from, to, _) in table {
        line = line.replace(&format!(" {from} "), &format!(" {to} "));
    }
    line.split_whitespace().map(String::from).collect()
}

/// `program` on `PATH`.
fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(program)).find(|p| p.is_file())
}

/// A scratch working directory with `examples` linked to the repository's.
fn workdir(name: &str) -> flowtune_fixtures::Scratch {
    let dir = scratch(name);
    std::os::unix::fs::symlink(
        root().join("examples").canonicalize().unwrap(),
        dir.join("examples"),
    )
    .unwrap();
    dir
}

/// Runs `words` in `cwd` with `env` (`flowtune` is the built binary, also first on `PATH` for
/// launchers that start it by name); returns standard output and error of a run that succeeded.
fn run(cwd: &Path, words: &[String], env: &[(&str, &Path)]) -> (String, String) {
    eprintln!("$ {}", words.join(" "));
    for w in words {
        assert!(
            !w.contains(['\'', '"', '$', '&', '|', ';', '<', '>']),
            "not plain words: {words:?}"
        );
    }
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_flowtune"));
    let program = if words[0] == "flowtune" { bin.clone() } else { PathBuf::from(&words[0]) };
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::iter::once(bin.parent().unwrap().to_path_buf());
    let mut c = Command::new(program);
    c.args(&words[1..]).current_dir(cwd).env_remove("WORLD_SIZE");
    c.env("PATH", std::env::join_paths(dirs.chain(std::env::split_paths(&path))).unwrap());
    c.env("GLOO_SOCKET_IFNAME", "lo").envs(env.iter().map(|(k, v)| (k, v.as_os_str())));
    let out = c.output().unwrap_or_else(|e| panic!("{}: {e}", words[0]));
    let (o, e) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "`{}` failed:\n{o}\n{e}", words.join(" "));
    (o.into_owned(), e.into_owned())
}

/// A YAML file's value at the dotted `key`.
fn yaml(file: &Path, key: &str) -> serde_yaml::Value {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let tree: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    key.split('.').fold(tree, |v, k| v[k].clone())
}

/// The value after the flag `flag` in `words`.
fn flag<'a>(words: &'a [String], flag: &str) -> &'a str {
    let i = words.iter().position(|w| w == flag).unwrap_or_else(|| panic!("no {flag}: {words:?}"));
    &words[i + 1]
}

/// After a `train` into `out` (relative to `cwd`): its LoRA holds tensors and its metrics hold
/// one line per step of the resolved recipe.
fn check_run(cwd: &Path, out: &str) {
    let out = cwd.join(out);
    let lora = out.join("lora/pytorch_lora_weights.safetensors");
    let tensors = tch::Tensor::read_safetensors(&lora).unwrap_or_else(|e| panic!("{lora:?}: {e}"));
    assert!(!tensors.is_empty(), "{lora:?} holds no tensors");
    let steps = yaml(&out.join("recipe.resolved.yaml"), "trainer.total_steps").as_u64().unwrap();
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count() as u64, steps, "{out:?}/metrics.jsonl");
}

/// The device total `flowtune plan` prints in its verdict (`verdict: fits: 52.7 GiB ≤ …`).
fn planned_gib(stdout: &str) -> f64 {
    let rest = stdout.split("verdict: fits: ").nth(1).unwrap_or_else(|| panic!("{stdout}"));
    let gib: f64 = rest.split(" GiB").next().unwrap().parse().unwrap();
    assert!(gib > 0.0, "{stdout}");
    gib
}

#[test]
fn the_cpu_tour_runs_as_written() {
    let dir = workdir("readme-tour");
    let tmp = dir.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let here = |w: &str| match w.strip_prefix(TMP) {
        Some(rest) => tmp.join(rest).display().to_string(),
        None => w.to_string(),
    };
    let tour = commands(&section(&readme(), "Five minutes on a CPU"));
    assert!(tour.len() >= 5, "{tour:?}");
    for words in &tour {
        assert_eq!(words[0], "flowtune", "the tour is flowtune commands: {words:?}");
        let mut words: Vec<String> = words.iter().map(|w| here(w)).collect();
        match words[1].as_str() {
            "train" => {
                let model = yaml(&dir.join(&words[2]), "model.path");
                if let Some(path) = model.as_str().filter(|p| p.starts_with(TMP)) {
                    words.push(format!("model.path={}", here(path)));
                }
            }
            "demo" => words.extend(DEMO_SHORT.iter().map(|s| s.to_string())),
            "sample" => {
                let lora = dir.join(flag(&words, "--lora"));
                assert!(lora.is_file(), "the LoRA `sample` reads: {lora:?}");
            }
            _ => {}
        }
        let (out, _) = run(&dir, &words, &[]);
        match words[1].as_str() {
            "list" => {
                let table = section(&readme(), "What it trains");
                let rows = table.lines().filter_map(|l| l.strip_prefix("| [`"));
                let named: BTreeSet<&str> = rows.map(|r| r.split('`').next().unwrap()).collect();
                let listed = families(&out);
                assert_eq!(listed.iter().map(String::as_str).collect::<BTreeSet<_>>(), named);
            }
            "make-tiny" => assert!(Path::new(&words[3]).join("model_index.json").is_file()),
            "train" => {
                let recipe = yaml(&dir.join(&words[2]), "trainer.output_dir");
                check_run(&dir, recipe.as_str().unwrap());
            }
            "sample" => {
                let prompts = std::fs::read_to_string(dir.join(flag(&words, "--prompts"))).unwrap();
                let n = prompts.lines().filter(|l| !l.trim().is_empty()).count();
                let pngs = std::fs::read_dir(flag(&words, "--out"))
                    .unwrap()
                    .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "png"))
                    .count();
                assert_eq!(pngs, n, "one picture per prompt");
            }
            "plan" => {
                planned_gib(&out);
            }
            "demo" => {
                let demo = dir.join("runs/demo");
                let summary = std::fs::read_to_string(demo.join("summary.json")).unwrap();
                let summary: serde_json::Value = serde_json::from_str(&summary).unwrap();
                assert_eq!(summary["steps"], 1, "{summary}");
                assert!(demo.join("before.png").is_file() && demo.join("after.png").is_file());
            }
            other => panic!("no check for `flowtune {other}`: add one"),
        }
    }
}

/// The model families `flowtune list` prints.
fn families(list: &str) -> Vec<String> {
    let rest = list.split("model families:\n").nth(1).unwrap_or_else(|| panic!("{list}"));
    let heads = rest.lines().take_while(|l| l.starts_with("  "));
    let heads = heads.filter(|l| !l.starts_with("   "));
    heads.map(|l| l.split_whitespace().next().unwrap().to_string()).collect()
}

/// A Hub cache in `cache` laid out as `huggingface_hub` does for [`HUB_ID`]:
/// `models--<owner>--<name>/refs/main` names a commit, `snapshots/<commit>` is its folder (a link
/// to `snapshot` if given, else left to be made); returns that folder.
fn hub_cache(cache: &Path, snapshot: Option<&Path>) -> PathBuf {
    let commit = "5a1e7c2f0d9b4e6a8c3f1b7d2e9a0c4f6b8d1e3a";
    let repo = cache.join(format!("models--{}", HUB_ID.replace('/', "--")));
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join("snapshots")).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    let folder = repo.join("snapshots").join(commit);
    if let Some(s) = snapshot {
        std::os::unix::fs::symlink(s, &folder).unwrap();
    }
    folder
}

#[test]
fn the_qwen_image_section_runs_on_tiny_stand_ins() {
    let dir = workdir("readme-qwen-image");
    let text = section(&readme(), "Train Qwen-Image on 8 GPUs");
    assert!(text.contains(&format!("model.path={HUB_ID}")), "the section trains {HUB_ID}");
    for (from, _, _) in GPU_STAND_INS {
        assert!(text.contains(from), "stand-in for `{from}`, which the section no longer has");
    }
    let configs = root().join("examples/models/qwen-image").canonicalize().unwrap();
    let plan_cache = dir.join("hub-configs");
    hub_cache(&plan_cache, Some(&configs));
    let train_cache = dir.join("hub-tiny");
    let tiny = hub_cache(&train_cache, None);
    let make = ["flowtune", "make-tiny", "qwen-image", tiny.to_str().unwrap()];
    run(&dir, &make.map(String::from), &[]);

    let real = dir.join("examples/flow_grpo_qwen_image.yaml");
    let out_dir = yaml(&real, "trainer.output_dir").as_str().unwrap().to_string();
    let mut trained = 0;
    let mut recipe_overrides: Vec<String> = vec![];
    for words in commands(&text) {
        if let Some(why) = skipped(&words) {
            eprintln!("skipped `{}`: {why}", words.join(" "));
            continue;
        }
        if words[0] == "torchrun" && on_path("torchrun").is_none() {
            eprintln!("skipped `{}`: torchrun is not on PATH", words.join(" "));
            continue;
        }
        let train = words.iter().position(|w| w == "train");
        let Some(at) = train else {
            assert_eq!(words[..2], ["flowtune", "plan"], "a command this test does not know");
            let (out, _) = run(&dir, &words, &[("HF_HUB_CACHE", &plan_cache)]);
            let at = text.find(" GiB a rank").expect("the section's per-rank figure");
            let claim: f64 = text[..at].rsplit(' ').next().unwrap().parse().unwrap();
            assert_eq!(planned_gib(&out), claim, "the section's per-rank figure");
            continue;
        };
        // torchrun's line takes "the same overrides after the recipe" as the launch line.
        if words.len() > at + 2 {
            recipe_overrides = words[at + 2..].to_vec();
        }
        let mut words = substitute(&words[..at + 2], GPU_STAND_INS);
        words.extend(recipe_overrides.iter().cloned());
        trained += 1;
        words.push(format!("trainer.output_dir={out_dir}"));
        words.push(format!("trainer.total_steps={trained}"));
        let (_, err) = run(&dir, &words, &[("HF_HUB_CACHE", &train_cache)]);
        assert_eq!(trained > 1, err.contains("resumed from"), "{err}");
        check_run(&dir, &out_dir);
    }
    assert!(trained >= 1, "the section's `flowtune launch … train` line ran");
    // Every file the section names under the run folder is there.
    let prefix = format!("{out_dir}/");
    let named: Vec<&str> = text
        .match_indices(&prefix)
        .map(|(i, _)| text[i..].split(|c: char| c.is_whitespace() || "`)\"'".contains(c)).next())
        .map(Option::unwrap)
        .collect();
    assert!(named.iter().any(|n| n.ends_with("/lora/pytorch_lora_weights.safetensors")));
    for path in &named {
        assert!(dir.join(path).exists(), "the section names {path}");
    }
    snippet(&dir, &text, &train_cache);
}

/// The section's Python snippet in `dir` (where the run left its LoRA), with diffusers from the
/// project's venv and `$FLOWTUNE_CACHE/anchors`, and `cache` as the Hub cache.
fn snippet(dir: &Path, text: &str, cache: &Path) {
    let home = PathBuf::from(std::env::var("HOME").unwrap_or_default());
    let var = |k: &str| std::env::var_os(k).map(PathBuf::from);
    let flowtune_cache = var("FLOWTUNE_CACHE").unwrap_or_else(|| home.join(".cache/flowtune"));
    let python = var("FLOWTUNE_VENV").unwrap_or_else(|| flowtune_cache.join("venv"));
    let python = python.join("bin/python");
    let site = flowtune_cache.join("anchors");
    let probe = Command::new(&python)
        .args(["-c", "import diffusers, peft"])
        .env("PYTHONPATH", &site)
        .output();
    if !probe.is_ok_and(|p| p.status.success()) {
        eprintln!("skipped the Python snippet: no diffusers for {python:?} in {site:?}");
        return;
    }
    let code = blocks(text, "python");
    assert_eq!(code.len(), 1, "one Python snippet");
    let mut code = code[0].clone();
    for (from, to, _) in SNIPPET_STAND_INS {
        assert!(code.contains(from), "stand-in for `{from}`, which the snippet no longer has");
        code = code.replace(from, to);
    }
    code.push_str("print('adapters:', pipe.get_list_adapters())\n");
    eprintln!("$ python (the README's snippet, stand-ins applied)");
    let image = code.split(".save(\"").nth(1).unwrap().split('"').next().unwrap().to_string();
    let out = Command::new(&python)
        .args(["-c", &code])
        .current_dir(dir)
        .env("PYTHONPATH", &site)
        .env("HF_HUB_CACHE", cache)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("adapters: {'transformer': ["), "the LoRA loaded: {said}");
    assert_eq!(image::image_dimensions(dir.join(&image)).unwrap(), (64, 64), "{image}");
}

/// Markdown link targets in `text` (no URLs or same-page anchors), without their `#anchor`.
fn links(text: &str) -> Vec<&str> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .map(|t| t.split('#').next().unwrap())
        .filter(|t| !t.is_empty() && !t.contains("://") && !t.starts_with("mailto:"))
        .collect()
}

/// Whether `target`, linked from the folder `from` (relative to the repository), leads outside it.
fn leaves_repository(from: &Path, target: &str) -> bool {
    let mut depth = from.components().count() as i64;
    for c in Path::new(target).components() {
        match c {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return true,
        }
        if depth < 0 {
            return true;
        }
    }
    false
}

/// Every `.md` file under `dir`.
fn markdown(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            markdown(&path, found);
        } else if path.extension().is_some_and(|e| e == "md") {
            found.push(path);
        }
    }
}

#[test]
fn the_readme_is_short_licensed_and_names_no_path_outside_the_repository() {
    let text = readme();
    let lines = text.lines().count();
    assert!(lines <= 250, "README.md has {lines} lines");
    let license = std::fs::read_to_string(root().join("LICENSE")).unwrap();
    assert!(license.contains("Apache License") && license.contains("Version 2.0"));
    // The first 30 lines name every family `flowtune list` knows.
    let head: String = text.lines().take(30).collect::<Vec<_>>().join("\n");
    let known = families(&stdout(&common::flowtune(&["list"])));
    for family in &known {
        assert!(head.contains(&format!("`{family}`")), "the first 30 lines lack `{family}`");
    }
    // `make X` in the README is a Makefile target.
    let makefile = std::fs::read_to_string(root().join("Makefile")).unwrap();
    for words in commands(&text).iter().filter(|w| w[0] == "make") {
        assert!(makefile.contains(&format!("\n{}:", words[1])), "no Makefile target {words:?}");
    }
    let mut files = vec![root().join("README.md")];
    markdown(&root().join("docs"), &mut files);
    assert!(files.len() > 10, "{files:?}");
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let rel = file.strip_prefix(root()).unwrap();
        for outside in ["/work/", "/home/", "/root/", "/Users/", "../shared"] {
            assert!(!text.contains(outside), "{rel:?} names `{outside}`");
        }
        for target in links(&text) {
            let from = rel.parent().unwrap();
            assert!(!leaves_repository(from, target), "{rel:?} links outside: {target}");
            if rel == Path::new("README.md") {
                assert!(root().join(target).exists(), "README.md links to missing {target}");
            }
        }
    }
}
