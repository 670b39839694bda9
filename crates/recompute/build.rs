//! Compiles csrc/recompute.cpp against the libtorch that torch-sys found.
fn main() {
    let (torch, _) = flowtune_torch_build::torch_dirs();
    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-changed=build.rs");
    flowtune_torch_build::cxx_build(&torch)
        .file("csrc/recompute.cpp")
        .compile("flowtune_recompute_shim");
}
