//! For build scripts of crates with a C++ shim over libtorch: where the torch that torch-sys found
//! lives, and a `cc::Build` with torch-sys's own flags (C++17, the wheel's C++ ABI, glog export).
//! The crate must depend on `torch-sys` directly so that its build script sees
//! `DEP_TCH_LIBTORCH_LIB`.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The torch directory (with `include/` and `lib/`) and its `lib/`.
pub fn torch_dirs() -> (PathBuf, PathBuf) {
    let lib = PathBuf::from(
        env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys did not export DEP_TCH_LIBTORCH_LIB"),
    );
    let torch = lib.parent().expect("libtorch lib dir has a parent").to_path_buf();
    (torch, lib)
}

/// A C++ build against `torch`'s headers with torch-sys's flags.
pub fn cxx_build(torch: &Path) -> cc::Build {
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .warnings(false)
        .include(torch.join("include"))
        .include(torch.join("include/torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={}", cxx11_abi()))
        .flag("-DGLOG_USE_GLOG_EXPORT");
    build
}

/// The CUDA runtime headers beside a CUDA torch wheel (`nvidia/cu13/include` or `cu12`), or why
/// there are none (a CPU-only torch, or the header wheels not installed).
pub fn cuda_includes(torch: &Path, lib: &Path) -> Result<PathBuf, String> {
    if !lib.join("libtorch_cuda.so").exists() {
        return Err(format!("{} has no libtorch_cuda.so (a CPU-only torch)", lib.display()));
    }
    let nvidia = nvidia_dir(torch);
    let cuda = ["cu13", "cu12"]
        .iter()
        .map(|v| nvidia.join(v).join("include"))
        .find(|d| d.join("cuda_runtime_api.h").exists());
    let Some(cuda) = cuda else {
        return Err(format!("no CUDA runtime headers under {}/cu13/include", nvidia.display()));
    };
    // Headers installed later (make setup) must rebuild the shim with CUDA.
    println!("cargo:rerun-if-changed={}", cuda.display());
    Ok(cuda)
}

/// The `nvidia/` folder of the wheels installed beside torch.
pub fn nvidia_dir(torch: &Path) -> PathBuf {
    torch.parent().map(|site| site.join("nvidia")).unwrap_or_default()
}

/// The `_GLIBCXX_USE_CXX11_ABI` value, read the way torch-sys reads it: from the Python torch when
/// `LIBTORCH_USE_PYTORCH` is set, else `LIBTORCH_CXX11_ABI`, else 1.
fn cxx11_abi() -> String {
    for var in ["LIBTORCH_USE_PYTORCH", "LIBTORCH_CXX11_ABI", "VIRTUAL_ENV"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    if env::var_os("LIBTORCH_USE_PYTORCH").is_none() {
        return env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_owned());
    }
    let python = if env::var_os("VIRTUAL_ENV").is_some() { "python" } else { "python3" };
    let output = Command::new(python)
        .args(["-c", "import torch; print(torch._C._GLIBCXX_USE_CXX11_ABI)"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python} to read torch's C++ ABI: {e}"));
    match String::from_utf8_lossy(&output.stdout).trim() {
        "True" => "1".to_owned(),
        "False" => "0".to_owned(),
        other => {
            panic!("{python} printed {other:?} for torch._C._GLIBCXX_USE_CXX11_ABI ({output:?})")
        }
    }
}
