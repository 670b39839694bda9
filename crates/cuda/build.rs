//! Compiles csrc/cuda.cpp against the libtorch that torch-sys found; with the CUDA runtime
//! headers beside a CUDA torch it reads devices and allocator statistics, without them it reports
//! that this build has no CUDA.
fn main() {
    let (torch, lib) = flowtune_torch_build::torch_dirs();
    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-changed=build.rs");
    let mut build = flowtune_torch_build::cxx_build(&torch);
    match flowtune_torch_build::cuda_includes(&torch, &lib) {
        Ok(dir) => {
            build.define("FLOWTUNE_CUDA", None).include(dir);
            // The caching allocator lives in libc10_cuda, which torch-sys does not link.
            println!("cargo:rustc-link-search=native={}", lib.display());
            println!("cargo:rustc-link-lib=dylib=c10_cuda");
            // dlsym, for cudaMemGetInfo (in libc itself from glibc 2.34 on).
            println!("cargo:rustc-link-lib=dylib=dl");
        }
        Err(missing) => println!(
            "cargo:warning=flowtune-cuda: no CUDA device facts in this build: {missing} (run `make setup`, then rebuild)"
        ),
    }
    build.file("csrc/cuda.cpp").compile("flowtune_cuda_shim");
}
