//! Running the built `flowtune` from the repository root, for the end-to-end tests.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The repository root (the example recipes name paths from there).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `flowtune` in the repository root, outside any launched job.
pub fn flowtune(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flowtune"))
        .args(args)
        .current_dir(root())
        .env_remove("WORLD_SIZE")
        .output()
        .expect("run flowtune")
}

/// The standard output of a run that must have succeeded (else its output and errors).
pub fn stdout(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    text
}
