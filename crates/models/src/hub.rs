//! Hugging Face Hub ids (`Qwen/Qwen-Image`) as model paths, resolved from the local Hugging Face
//! cache as the `huggingface_hub` client lays it out, with no network access:
//! `<cache>/models--<owner>--<name>/refs/main` holds a commit, `snapshots/<commit>/` the files.
//! The cache is `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`.

use std::path::{Path, PathBuf};

use crate::ModelError;

/// `path` itself when it exists or is not a Hub id; else the cached snapshot of the id.
pub fn resolve(path: &Path) -> Result<PathBuf, ModelError> {
    resolve_in(path, &cache_dir())
}

/// [`resolve`] against the cache folder `cache`.
pub fn resolve_in(path: &Path, cache: &Path) -> Result<PathBuf, ModelError> {
    let Some((owner, name)) = hub_id(path) else {
        return Ok(path.to_path_buf());
    };
    let repo = cache.join(format!("models--{owner}--{name}"));
    let missing = |why: String| {
        ModelError::Input(format!(
            "{}: no such directory, and {why}; download it with `hf download {owner}/{name}` \
             (huggingface_hub), set HF_HUB_CACHE or HF_HOME to the cache that holds it, or give \
             the path of a diffusers pipeline directory",
            path.display()
        ))
    };
    let refs = repo.join("refs/main");
    let commit = match std::fs::read_to_string(&refs) {
        Ok(text) => text.trim().to_string(),
        Err(_) if repo.is_dir() => {
            return Err(missing(format!("{} has no refs/main", repo.display())))
        }
        Err(_) => return Err(missing(format!("the Hugging Face cache has no {}", repo.display()))),
    };
    let snapshot = repo.join("snapshots").join(&commit);
    if !snapshot.is_dir() {
        return Err(missing(format!(
            "{} names commit {commit}, whose snapshot {} is missing",
            refs.display(),
            snapshot.display()
        )));
    }
    Ok(snapshot)
}

/// `owner/name` of a path that does not exist and reads as a Hub id.
fn hub_id(path: &Path) -> Option<(&str, &str)> {
    if path.exists() {
        return None;
    }
    split_hub_id(path.to_str()?)
}

/// Whether `text` has the form of a Hub id (`owner/name`), whatever is on disk.
pub fn reads_as_hub_id(text: &str) -> bool {
    split_hub_id(text).is_some()
}

fn split_hub_id(text: &str) -> Option<(&str, &str)> {
    let (owner, name) = text.split_once('/')?;
    let part = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    (part(owner) && part(name)).then_some((owner, name))
}

/// The Hugging Face hub cache folder, as the `huggingface_hub` client finds it.
fn cache_dir() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("HF_HUB_CACHE")
        .or_else(|| var("HF_HOME").map(|home| home.join("hub")))
        .or_else(|| var("XDG_CACHE_HOME").map(|x| x.join("huggingface/hub")))
        .or_else(|| var("HOME").map(|home| home.join(".cache/huggingface/hub")))
        .unwrap_or_else(|| PathBuf::from(".cache/huggingface/hub"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache laid out as `huggingface_hub` writes it: refs/main, a snapshot, a blob.
    fn fake_cache(root: &Path) -> PathBuf {
        let repo = root.join("models--Qwen--Qwen-Image");
        let commit = "75e0b4be04f60ec59a75f475837eced720f823b6";
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), commit).unwrap();
        let snapshot = repo.join("snapshots").join(commit);
        std::fs::create_dir_all(&snapshot).unwrap();
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::write(repo.join("blobs/abc"), "{}").unwrap();
        std::os::unix::fs::symlink(repo.join("blobs/abc"), snapshot.join("model_index.json"))
            .unwrap();
        snapshot
    }

    #[test]
    fn an_id_resolves_to_its_cached_snapshot() {
        let cache = tempfile::tempdir().unwrap();
        let snapshot = fake_cache(cache.path());
        let got = resolve_in(Path::new("Qwen/Qwen-Image"), cache.path()).unwrap();
        assert_eq!(got, snapshot);
        assert!(got.join("model_index.json").exists());
    }

    #[test]
    fn paths_that_are_not_ids_pass_through() {
        let cache = tempfile::tempdir().unwrap();
        for p in ["/nonexistent/pipeline", "runs/x/y", "./a/b", "tiny"] {
            assert_eq!(resolve_in(Path::new(p), cache.path()).unwrap(), PathBuf::from(p));
        }
        // An existing directory wins over a cached id of the same name.
        let here = cache.path().join("Qwen/Qwen-Image");
        std::fs::create_dir_all(&here).unwrap();
        assert_eq!(resolve_in(&here, cache.path()).unwrap(), here);
    }

    #[test]
    fn a_missing_model_says_how_to_download_it() {
        let cache = tempfile::tempdir().unwrap();
        let err = resolve_in(Path::new("black-forest-labs/FLUX.1-dev"), cache.path())
            .unwrap_err()
            .to_string();
        for needle in ["black-forest-labs/FLUX.1-dev", "models--black-forest-labs--FLUX.1-dev"] {
            assert!(err.contains(needle), "{err}");
        }
        assert!(err.contains("hf download black-forest-labs/FLUX.1-dev"), "{err}");
        // A repo folder without the commit it names.
        let repo = cache.path().join("models--a--b");
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "deadbeef").unwrap();
        let err = resolve_in(Path::new("a/b"), cache.path()).unwrap_err().to_string();
        assert!(err.contains("names commit deadbeef"), "{err}");
    }
}
