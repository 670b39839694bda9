//! Compiles csrc/shim.cpp against the libtorch that torch-sys found, with torch-sys's own flags, the
//! project's gloo declaration stubs, and NCCL when the CUDA/NCCL headers sit next to the torch wheel.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let lib = PathBuf::from(
        env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys did not export DEP_TCH_LIBTORCH_LIB"),
    );
    let torch = lib.parent().expect("libtorch lib dir has a parent").to_path_buf();
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-changed=build.rs");

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .warnings(false)
        .include(torch.join("include"))
        .include(torch.join("include/torch/csrc/api/include"))
        .include(manifest.join("csrc/gloo_stub"))
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={}", cxx11_abi()))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .define("USE_C10D_GLOO", None)
        .file(manifest.join("csrc/shim.cpp"));
    match nccl_includes(&torch, &lib) {
        Ok(dirs) => {
            build.define("USE_C10D_NCCL", None).includes(dirs);
        }
        Err(missing) => println!(
            "cargo:warning=flowtune-dist: building with Gloo only, no NCCL: {missing} (run `make setup`, which installs the CUDA header wheels, then rebuild)"
        ),
    }
    build.compile("flowtune_dist_shim");
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
        .unwrap_or_else(|e| {
            panic!("flowtune-dist: cannot run {python} to read torch's C++ ABI: {e}")
        });
    match String::from_utf8_lossy(&output.stdout).trim() {
        "True" => "1".to_owned(),
        "False" => "0".to_owned(),
        other => panic!("flowtune-dist: {python} printed {other:?} for torch._C._GLIBCXX_USE_CXX11_ABI ({output:?})"),
    }
}

/// Include directories for ProcessGroupNCCL.hpp (the NCCL, CUDA runtime, crt and cccl headers of the
/// nvidia wheels beside torch), or what is missing. A torch without libtorch_cuda gets Gloo only.
fn nccl_includes(torch: &Path, lib: &Path) -> Result<Vec<PathBuf>, String> {
    if !lib.join("libtorch_cuda.so").exists() {
        return Err(format!("{} has no libtorch_cuda.so (a CPU-only torch)", lib.display()));
    }
    let nvidia = torch.parent().map(|site| site.join("nvidia")).unwrap_or_default();
    let cuda = ["cu13", "cu12"]
        .iter()
        .map(|v| nvidia.join(v).join("include"))
        .find(|d| d.join("cuda_runtime_api.h").exists());
    if let Some(dir) = &cuda {
        // Headers installed later (make setup) must rebuild the shim with NCCL.
        println!("cargo:rerun-if-changed={}", dir.display());
    }
    let Some(cuda) = cuda else {
        return Err(format!("no CUDA runtime headers under {}/cu13/include", nvidia.display()));
    };
    let mut dirs = vec![cuda.clone()];
    let needed = [
        ("nccl.h", vec![nvidia.join("nccl/include")]),
        ("crt/host_config.h", vec![cuda.clone()]),
        ("nv/target", vec![cuda.clone(), cuda.join("cccl")]),
    ];
    for (header, candidates) in needed {
        match candidates.into_iter().find(|d| d.join(header).exists()) {
            Some(dir) => dirs.push(dir),
            None => return Err(format!("{header} not found under {} (wheels nvidia-nccl, nvidia-cuda-crt, nvidia-cuda-cccl)", nvidia.display())),
        }
    }
    dirs.sort();
    dirs.dedup();
    Ok(dirs)
}
