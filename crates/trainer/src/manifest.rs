//! A checkpoint's manifest (`manifest.json`): every file's size and CRC-32, written last, so that
//! a resume tells a whole checkpoint from one truncated or damaged since it was written.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::TrainError;

const MANIFEST: &str = "manifest.json";

/// One file's size and checksum.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Entry {
    bytes: u64,
    crc32: u32,
}

/// The files under `dir` (one level of folders down), by path relative to it.
fn files(dir: &Path) -> Result<Vec<PathBuf>, TrainError> {
    let mut out = vec![];
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).map_err(|e| TrainError::io(&folder, e))?.flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if path.file_name().is_some_and(|n| n != MANIFEST) {
                out.push(path.strip_prefix(dir).expect("below dir").to_path_buf());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The size and CRC-32 of `path`, read in 8 MiB pieces.
fn entry(path: &Path) -> Result<Entry, TrainError> {
    let mut file = std::fs::File::open(path).map_err(|e| TrainError::io(path, e))?;
    let (mut hasher, mut bytes) = (crc32fast::Hasher::new(), 0u64);
    let mut buffer = vec![0u8; 8 << 20];
    loop {
        let n = file.read(&mut buffer).map_err(|e| TrainError::io(path, e))?;
        if n == 0 {
            return Ok(Entry { bytes, crc32: hasher.finalize() });
        }
        hasher.update(&buffer[..n]);
        bytes += n as u64;
    }
}

/// Writes the manifest of every file in the checkpoint folder `dir`.
pub(crate) fn write(dir: &Path) -> Result<(), TrainError> {
    let mut manifest = BTreeMap::new();
    for file in files(dir)? {
        manifest.insert(file.display().to_string(), entry(&dir.join(&file))?);
    }
    let text = serde_json::to_string_pretty(&manifest).expect("JSON");
    let path = dir.join(MANIFEST);
    std::fs::write(&path, text).map_err(|e| TrainError::io(&path, e))
}

/// Why the checkpoint `dir` is not as its manifest wrote it, if it is not (a checkpoint from
/// before manifests is taken as it is).
pub(crate) fn damage(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(MANIFEST)).ok()?;
    let manifest: BTreeMap<String, Entry> = match serde_json::from_str(&text) {
        Ok(m) => m,
        Err(e) => return Some(format!("{MANIFEST} is unreadable: {e}")),
    };
    for (name, want) in manifest {
        let path = dir.join(&name);
        let found = match std::fs::metadata(&path) {
            Err(_) => return Some(format!("{name} is missing")),
            Ok(m) if m.len() != want.bytes => {
                return Some(format!("{name} has {} bytes, {} when written", m.len(), want.bytes))
            }
            Ok(_) => entry(&path),
        };
        match found {
            Ok(e) if e.crc32 != want.crc32 => {
                return Some(format!("{name} differs from what was written (CRC-32)"))
            }
            Err(e) => return Some(e.to_string()),
            Ok(_) => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damaged_checkpoints_are_told_apart() {
        let dir = flowtune_fixtures::scratch("manifest");
        std::fs::create_dir_all(dir.join("blocks")).unwrap();
        std::fs::write(dir.join("a.safetensors"), b"0123456789").unwrap();
        std::fs::write(dir.join("blocks/b.safetensors"), b"abc").unwrap();
        assert_eq!(damage(&dir), None, "no manifest: taken as it is");
        write(&dir).unwrap();
        assert_eq!(damage(&dir), None);
        std::fs::write(dir.join("blocks/b.safetensors"), b"abd").unwrap();
        assert_eq!(
            damage(&dir).unwrap(),
            "blocks/b.safetensors differs from what was written (CRC-32)"
        );
        std::fs::write(dir.join("a.safetensors"), b"01234").unwrap();
        assert_eq!(damage(&dir).unwrap(), "a.safetensors has 5 bytes, 10 when written");
        std::fs::remove_file(dir.join("a.safetensors")).unwrap();
        assert_eq!(damage(&dir).unwrap(), "a.safetensors is missing");
    }
}
