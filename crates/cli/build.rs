//! Links the `flowtune` binary so it can use a GPU: keeps `libtorch_cuda.so` as a dependency even
//! though no symbol of it is referenced (the default `--as-needed` link drops it, and CUDA then
//! silently reports no device), records the torch version for `flowtune env`, and sets a RUNPATH
//! to the build's torch libraries (`LD_LIBRARY_PATH`, e.g. from `scripts/env.sh`, still wins).

use std::path::PathBuf;
use std::process::Command;

const PROBE: &str = "import os, torch; print(torch.__version__); print(os.path.join(os.path.dirname(torch.__file__), 'lib'))";

fn main() {
    println!("cargo:rerun-if-env-changed=VIRTUAL_ENV");
    println!("cargo:rerun-if-env-changed=LIBTORCH_USE_PYTORCH");
    // The same interpreter torch-sys asks for the libtorch it links.
    let python = if std::env::var_os("VIRTUAL_ENV").is_some() { "python" } else { "python3" };
    let probe = Command::new(python).args(["-c", PROBE]).output();
    let Some((version, lib)) = probe.ok().filter(|o| o.status.success()).and_then(|o| {
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        let mut lines = text.lines();
        Some((lines.next()?.to_string(), PathBuf::from(lines.next()?)))
    }) else {
        println!(
            "cargo:warning=torch not found through {python}; run `source scripts/env.sh` first"
        );
        println!("cargo:rustc-env=FLOWTUNE_TORCH_VERSION=unknown");
        println!("cargo:rustc-env=FLOWTUNE_TORCH_LIB=unknown");
        return;
    };
    println!("cargo:rustc-env=FLOWTUNE_TORCH_VERSION={version}");
    println!("cargo:rustc-env=FLOWTUNE_TORCH_LIB={}", lib.display());
    println!("cargo:rustc-link-arg-bins=-Wl,--enable-new-dtags,-rpath,{}", lib.display());
    if lib.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg-bins=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
}
