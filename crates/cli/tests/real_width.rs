//! `make-tiny <family> --config … --layers 1 --dtype bf16`: the transformer takes the config's
//! widths with one block and bf16 weights, and the tiny text encoders and VAE match it, so that a
//! rollout runs. The configs are the shipped real ones narrowed by the test (real width is slow to
//! write), except Wan2.2-TI2V-5B's, which is cheap at one block.

use std::path::{Path, PathBuf};
use std::process::Command;

use flowtune_fixtures::scratch;
use serde_json::{json, Value};

fn flowtune(args: &[&str], dir: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_flowtune")).args(args).arg(dir).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn read(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The shipped real `examples/models/<model>/transformer/config.json` with `changes`, written
/// into `dir`.
fn config(model: &str, changes: Value, dir: &Path) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/models");
    let mut config = read(&root.join(model).join("transformer/config.json"));
    for (key, value) in changes.as_object().unwrap() {
        config[key] = value.clone();
    }
    let path = dir.join(format!("{model}.json"));
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

/// The dtypes in a safetensors file's header.
fn dtypes(file: &Path) -> Vec<String> {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut all: Vec<String> = header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(_, v)| v["dtype"].as_str().unwrap().to_string())
        .collect();
    all.sort();
    all.dedup();
    all
}

/// A shipped model, `make-tiny`'s family and flags, the test's changes to its config, and
/// what the written `config.json` holds.
type Case = (&'static str, &'static [&'static str], Value, &'static [(&'static str, &'static str)]);

#[test]
fn every_family_takes_a_real_config_with_one_block_in_bf16() {
    let root = scratch("real-width");
    let cases: [Case; 6] = [
        (
            "sd3.5-medium",
            &["sd3"],
            json!({"num_attention_heads": 2, "attention_head_dim": 16, "caption_projection_dim": 32,
                "joint_attention_dim": 64, "pooled_projection_dim": 48, "sample_size": 32,
                "pos_embed_max_size": 16}),
            &[("num_layers", "1"), ("dual_attention_layers", "[0]")],
        ),
        (
            "flux.1-dev",
            &["flux", "--single-layers", "1"],
            json!({"num_attention_heads": 2, "attention_head_dim": 16, "axes_dims_rope": [4, 6, 6],
                "joint_attention_dim": 32, "pooled_projection_dim": 16}),
            &[("num_layers", "1"), ("num_single_layers", "1")],
        ),
        (
            "qwen-image",
            &["qwen-image"],
            json!({"num_attention_heads": 2, "attention_head_dim": 16, "axes_dims_rope": [4, 6, 6],
                "joint_attention_dim": 32}),
            &[("num_layers", "1"), ("joint_attention_dim", "32")],
        ),
        (
            "z-image-turbo",
            &["z-image"],
            json!({"dim": 64, "n_heads": 2, "n_kv_heads": 2, "axes_dims": [8, 12, 12],
                "cap_feat_dim": 32}),
            &[("n_layers", "1"), ("n_refiner_layers", "2")],
        ),
        (
            "wan2.2-t2v-a14b",
            &["wan", "--a14b"],
            json!({"num_attention_heads": 2, "attention_head_dim": 16, "ffn_dim": 64,
                "text_dim": 32}),
            &[("num_layers", "1"), ("attention_head_dim", "16")],
        ),
        ("wan2.2-ti2v-5b", &["wan"], json!({}), &[("num_layers", "1"), ("ffn_dim", "14336")]),
    ];
    for (model, args, changes, want) in cases {
        let dir = root.join(model);
        let config = config(model, changes, &root);
        let mut all = vec!["make-tiny", args[0], "--layers", "1", "--dtype", "bf16", "--config"];
        all.push(config.to_str().unwrap());
        all.extend_from_slice(&args[1..]);
        flowtune(&all, &dir);
        let experts: &[&str] = if model.contains("a14b") {
            &["transformer", "transformer_2"]
        } else {
            &["transformer"]
        };
        for expert in experts {
            let written = read(&dir.join(expert).join("config.json"));
            for (key, value) in want {
                assert_eq!(written[key].to_string(), *value, "{model} {expert} {key}");
            }
            let weights = dir.join(expert).join("diffusion_pytorch_model.safetensors");
            assert_eq!(dtypes(&weights), ["BF16"], "{model} {expert}");
        }
        let frames: &[&str] = if args[0] == "wan" { &["--num-frames", "5"] } else { &[] };
        let mut rollout = vec!["bench", "rollout", "--batch", "1", "--steps", "2", "--iters", "1"];
        rollout.extend_from_slice(&["--resolution", "32"]);
        rollout.extend_from_slice(frames);
        rollout.push("--model");
        flowtune(&rollout, &dir);
    }
}
