//! Exact loading at real width: a Qwen-Image-width transformer (one block of 24 heads × 128),
//! stored in bf16 or stored in f32 and converted, loads as bf16 with the process's resident memory
//! growing by at most 1.15× the loaded weights' bytes: no f32 staging, no second copy, and the
//! mapped file's pages handed back slice by slice as they are copied.

use std::process::Command;

use flowtune_fixtures::scratch;

fn flowtune() -> Command {
    Command::new(env!("CARGO_BIN_EXE_flowtune"))
}

/// `bench load`'s JSON line for `dir/transformer` loaded as `dtype`.
fn load(dir: &std::path::Path, dtype: &str) -> serde_json::Value {
    let out = flowtune()
        .args(["bench", "load", "--dtype", dtype, "--component"])
        .arg(dir.join("transformer"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_real_width_transformer_loads_in_its_own_size() {
    for stored in ["bf16", "f32"] {
        let dir = scratch(&format!("load-{stored}"));
        let made = flowtune()
            .args(["make-tiny", "qwen-image", "--layers", "1", "--heads", "24", "--head-dim"])
            .args(["128", "--text-width", "64", "--dtype", stored])
            .arg(&*dir)
            .output()
            .unwrap();
        assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
        let line = load(&dir, "bf16");
        let weights = line["weights_bytes"].as_f64().unwrap();
        assert!(weights > 0.5e9, "a real-width block: {line}");
        let parameters = weights / 2.0;
        let grown =
            line["rss_peak_bytes"].as_f64().unwrap() - line["rss_before_bytes"].as_f64().unwrap();
        eprintln!(
            "{stored} checkpoint as bf16: {:.0} M parameters, resident memory grew {:.3}× the weights",
            parameters / 1e6,
            grown / weights
        );
        assert!(grown <= 1.15 * weights, "{stored}: grew {grown} for {weights}: {line}");
    }
}
