//! PEFT's LoRA options against diffusers (`scripts/reference_interop.py lora`): adapters saved
//! with `use_rslora`, `alpha_pattern`, `rank_pattern` and without metadata load onto the tiny SD3
//! transformer with diffusers' outputs; exporting them keeps their config and outputs; options
//! flowtune does not apply are refused by name. With `FLOWTUNE_LORA_EXPORT=<dir>` the exported
//! files and outputs are kept for `reference_interop.py lora-check <dir>`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use flowtune_fixtures::{dir, tensors, Checker};
use flowtune_models::lora::{self, LoraConfig};
use flowtune_models::sd3::Sd3Transformer;
use flowtune_models::TrainableDenoiser;
use tch::{Device, Kind, Tensor};

const CASES: [&str; 4] = ["rslora", "alpha_pattern", "rank_pattern", "no_metadata"];

fn file(case: &str) -> PathBuf {
    dir().join(format!("sd3_lora_{case}.safetensors"))
}

/// `sd3_tiny` with the adapters of `path`, configured as its metadata says, on `sd3_tiny_io`.
fn output(path: &Path, io: &HashMap<String, Tensor>) -> (LoraConfig, Tensor) {
    let config = lora::read_config(path, "transformer").expect("config");
    let mut model =
        Sd3Transformer::load(&dir().join("sd3_tiny"), Device::Cpu, Kind::Float, Some(&config))
            .expect("load");
    model.load_lora(path).expect("load lora");
    let input = |k: &str| &io[&format!("input.{k}")];
    let out = tch::no_grad(|| {
        model.forward(
            input("hidden_states"),
            input("encoder_hidden_states"),
            input("pooled_projections"),
            input("timestep"),
        )
    });
    (config, out.expect("forward"))
}

#[test]
fn peft_options_load_export_and_reload_as_diffusers() {
    let io = tensors("sd3_tiny_io.safetensors");
    let want = tensors("sd3_lora_options_io.safetensors");
    let kept = std::env::var_os("FLOWTUNE_LORA_EXPORT").map(PathBuf::from);
    let scratch = tempfile::tempdir().unwrap();
    let out_dir = kept.clone().unwrap_or_else(|| scratch.path().to_path_buf());
    std::fs::create_dir_all(&out_dir).unwrap();
    let mut check = Checker::new("sd3_lora_options_io.safetensors");
    for case in CASES {
        check.case();
        let (config, out) = output(&file(case), &io);
        // The project's f32 parity tolerance: diffusers made the fixture on an Intel CPU, and on
        // an AMD EPYC the same model differs by up to 7e-5 (rslora's scale 4 amplifies the
        // adapters' share of the kernels' rounding). The export below is compared exactly.
        check.close(case, &out, &want[&format!("output.{case}")]);

        let exported = out_dir.join(format!("{case}.safetensors"));
        let mut model =
            Sd3Transformer::load(&dir().join("sd3_tiny"), Device::Cpu, Kind::Float, Some(&config))
                .unwrap();
        model.load_lora(&file(case)).unwrap();
        model.save_lora(&exported).expect("export");
        assert_eq!(lora::read_config(&exported, "transformer").unwrap(), config, "{case}");
        let (_, again) = output(&exported, &io);
        check.close_within(&format!("{case} exported"), &again, &out, 0.0);
        if kept.is_some() {
            let path = out_dir.join(format!("{case}.out.safetensors"));
            Tensor::write_safetensors(&[("output", &again)], path).unwrap();
        }
    }
    check.finish();
}

#[test]
fn configs_read_as_peft_builds_them() {
    let rslora = lora::read_config(&file("rslora"), "transformer").unwrap();
    assert!(rslora.use_rslora);
    assert_eq!(rslora.scale_of("transformer_blocks.0.attn.to_q"), 8.0 / 2.0);
    let ranks = lora::read_config(&file("rank_pattern"), "transformer").unwrap();
    assert_eq!(ranks.rank_of("transformer_blocks.0.attn.to_v"), 2);
    assert_eq!(ranks.rank_of("transformer_blocks.1.attn.to_q"), 6);
    assert_eq!(ranks.scale_of("transformer_blocks.1.attn.add_k_proj"), 3.0 / 4.0);
    // Without metadata diffusers takes the most common rank and α = r for every module.
    let bare = lora::read_config(&file("no_metadata"), "transformer").unwrap();
    assert_eq!((bare.rank, bare.alpha), (4, 4.0));
    assert_eq!(bare.rank_of("transformer_blocks.0.attn.to_out.0"), 2);
    assert_eq!(bare.scale_of("transformer_blocks.0.attn.to_out.0"), 1.0);
}

/// The rslora fixture's tensors with `metadata` (a JSON object) and `extra` tensors.
fn rewritten(metadata: &str, extra: &[(&str, Tensor)], name: &str) -> PathBuf {
    let mut named: Vec<(String, Tensor)> = Tensor::read_safetensors(file("rslora")).unwrap();
    named.extend(extra.iter().map(|(n, t)| (n.to_string(), t.shallow_clone())));
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = named
        .iter()
        .map(|(n, t)| {
            let values = Vec::<f32>::try_from(t.flatten(0, -1)).unwrap();
            let shape = t.size().iter().map(|&d| d as usize).collect();
            (n.clone(), shape, values.iter().flat_map(|v| v.to_le_bytes()).collect())
        })
        .collect();
    let views = data.iter().map(|(n, shape, bytes)| {
        let view =
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes);
        (n.clone(), view.unwrap())
    });
    let meta = HashMap::from([("lora_adapter_metadata".to_string(), metadata.to_string())]);
    let path =
        std::env::temp_dir().join(format!("flowtune-{name}-{}.safetensors", std::process::id()));
    safetensors::serialize_to_file(views, Some(meta), &path).unwrap();
    path
}

#[test]
fn options_flowtune_does_not_apply_are_refused_by_name() {
    let base = r#""transformer.r": 4, "transformer.lora_alpha": 8, "transformer.use_rslora": true"#;
    let refused = |metadata: &str, extra: &[(&str, Tensor)], name: &str| {
        let path = rewritten(&format!("{{{base}{metadata}}}"), extra, name);
        let err = lora::read_config(&path, "transformer").unwrap_err().to_string();
        std::fs::remove_file(path).unwrap();
        err
    };
    for (option, value) in [
        ("use_dora", "true"),
        ("lora_bias", "true"),
        ("bias", "\"lora_only\""),
        ("fan_in_fan_out", "true"),
        ("exclude_modules", "[\"to_q\"]"),
        ("layers_to_transform", "[0]"),
        ("modules_to_save", "[\"proj_out\"]"),
        ("alora_invocation_tokens", "[5]"),
        ("init_lora_weights", "\"pissa\""),
        ("some_future_option", "1.5"),
    ] {
        let err = refused(&format!(", \"transformer.{option}\": {value}"), &[], option);
        assert!(err.contains(&format!("`{option}` = {value}")), "{option}: {err}");
    }
    let inert = r#", "transformer.use_dora": false, "transformer.lora_dropout": 0.1, "transformer.bias": "none", "transformer.init_lora_weights": "gaussian", "transformer.megatron_core": "megatron.core""#;
    let path = rewritten(&format!("{{{base}{inert}}}"), &[], "inert");
    assert!(lora::read_config(&path, "transformer").is_ok());
    std::fs::remove_file(path).unwrap();
    let module = "transformer.transformer_blocks.0.attn.to_q";
    let magnitude = format!("{module}.lora_magnitude_vector");
    let err = refused("", &[(&magnitude, Tensor::ones([32], (Kind::Float, Device::Cpu)))], "dora");
    assert!(err.contains("use_dora"), "{err}");
    let bias = format!("{module}.lora_B.bias");
    let err = refused("", &[(&bias, Tensor::ones([32], (Kind::Float, Device::Cpu)))], "bias");
    assert!(err.contains("lora_bias"), "{err}");
}

#[test]
fn recipe_keys_have_peft_meaning() {
    let config: LoraConfig = serde_json::from_str(
        r#"{"rank": 4, "alpha": 8, "target_modules": ["to_q", "to_k"], "use_rslora": true,
            "rank_pattern": {"blocks.0.to_k": 2}, "alpha_pattern": {"to_k": 6}}"#,
    )
    .unwrap();
    assert_eq!(config.rank_of("blocks.0.to_k"), 2);
    assert_eq!(config.scale_of("blocks.0.to_k"), 6.0 / 2f64.sqrt());
    assert_eq!(config.scale_of("blocks.1.to_q"), 8.0 / 2.0);
    let err = serde_json::from_str::<LoraConfig>(r#"{"use_dora": true}"#).unwrap_err();
    assert!(err.to_string().contains("unknown field `use_dora`"), "{err}");
    let bad = LoraConfig { rank_pattern: [("to_(q".into(), 2)].into_iter().collect(), ..config };
    assert!(bad.validate().unwrap_err().to_string().contains("rank_pattern key `to_(q`"));
}

/// A `rank_pattern` / `alpha_pattern` key that names no adapted module (a typo would train those
/// at `rank` / `alpha`) is refused by name when the adapters are built, before any weight is read;
/// a LoRA file's config is held to the same rule. Keys that name adapted modules build.
#[test]
fn pattern_keys_that_name_no_adapted_module_are_refused() {
    let config_only = flowtune_fixtures::scratch("lora-pattern-keys");
    std::fs::copy(dir().join("sd3_tiny/config.json"), config_only.join("config.json")).unwrap();
    let build = |rank: &[(&str, i64)], alpha: &[(&str, f64)], model: &Path| {
        let config = LoraConfig {
            rank: 4,
            rank_pattern: rank.iter().map(|&(k, r)| (k.to_string(), r)).collect(),
            alpha_pattern: alpha.iter().map(|&(k, a)| (k.to_string(), a)).collect(),
            ..Default::default()
        };
        Sd3Transformer::load(model, Device::Cpu, Kind::Float, Some(&config)).map(drop)
    };
    let refused = |rank, alpha| build(rank, alpha, &config_only).unwrap_err().to_string();
    let err = refused(&[("transformer_blocks.1.attn.to_k", 2), ("attn.to_kk", 2)], &[]);
    assert!(err.contains("model.lora.rank_pattern key `attn.to_kk` names none"), "{err}");
    assert!(err.contains("nearest: `attn.to_k`, `attn.to_q`, `attn.to_v`"), "{err}");
    // `proj_out` is a layer, but not one the LoRA targets.
    let err = refused(&[], &[("proj_out", 6.0)]);
    assert!(err.contains("model.lora.alpha_pattern key `proj_out` names none"), "{err}");
    build(&[("transformer_blocks.1.attn.to_k", 2)], &[("to_k", 6.0)], &dir().join("sd3_tiny"))
        .expect("keys that name adapted modules");

    let base = r#""transformer.r": 4, "transformer.lora_alpha": 8, "transformer.use_rslora": true"#;
    let path = rewritten(
        &format!(r#"{{{base}, "transformer.alpha_pattern": {{"to_kk": 6}}}}"#),
        &[],
        "dead-key",
    );
    let err = lora::read_config(&path, "transformer").unwrap_err().to_string();
    std::fs::remove_file(&path).unwrap();
    assert!(err.contains("transformer.alpha_pattern key `to_kk` names none"), "{err}");
    assert!(err.starts_with(&path.display().to_string()), "{err}");
}
