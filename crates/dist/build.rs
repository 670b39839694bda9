//! Compiles csrc/shim.cpp against the libtorch that torch-sys found, with torch-sys's own flags, the
//! project's gloo declaration stubs, and NCCL when the CUDA/NCCL headers sit next to the torch wheel.
use std::env;
use std::path::{Path, PathBuf};

fn main() {
    let (torch, lib) = flowtune_torch_build::torch_dirs();
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-changed=build.rs");

    let mut build = flowtune_torch_build::cxx_build(&torch);
    build
        .include(manifest.join("csrc/gloo_stub"))
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

/// Include directories for ProcessGroupNCCL.hpp (the NCCL, CUDA runtime, crt and cccl headers of the
/// nvidia wheels beside torch), or what is missing. A torch without libtorch_cuda gets Gloo only.
fn nccl_includes(torch: &Path, lib: &Path) -> Result<Vec<PathBuf>, String> {
    let cuda = flowtune_torch_build::cuda_includes(torch, lib)?;
    let nvidia = flowtune_torch_build::nvidia_dir(torch);
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
