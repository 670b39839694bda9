//! Z-Image transformer parity with diffusers over every `z_image_transformer` fixture of
//! `manifest.json` (`scripts/reference_z_image.py`): outputs with and without LoRA (the recipe
//! targets and `all-linear`), every LoRA gradient, captions of different lengths in one batch,
//! and the timestep / sign conversion of `velocity`.

mod common;

use std::collections::HashMap;

use flowtune_fixtures::{dir, models_of_kind, tensors, MODEL_RTOL};
use flowtune_models::z_image::ZImageTransformer;
use flowtune_models::{Denoiser, TextConditioning, TrainableDenoiser};
use tch::{Device, Kind, Tensor};

fn forward(m: &ZImageTransformer, io: &HashMap<String, Tensor>) -> Tensor {
    let named: HashMap<String, Tensor> = io
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("input.").map(|k| (k.to_string(), v.shallow_clone())))
        .collect();
    m.forward_named(&named).expect("forward")
}

#[test]
fn z_image_transformers_match_diffusers() {
    // Layers off the pipeline's patch pair get no gradient.
    common::check_lora_fixtures(
        "z_image_transformer",
        |dir, lora| {
            ZImageTransformer::load(dir, Device::Cpu, Kind::Float, Some(lora)).expect("load")
        },
        forward,
        true,
    );
}

#[test]
fn velocity_converts_timestep_and_sign() {
    let entry = &models_of_kind("z_image_transformer")[0];
    let name = entry["name"].as_str().unwrap();
    let io = tensors(&format!("{name}_io.safetensors"));
    let model =
        ZImageTransformer::load(&dir().join(name), Device::Cpu, Kind::Float, None).expect("load");
    let mut text = TextConditioning::new(io["input.cap_feats"].shallow_clone(), None);
    text.mask = Some(io["input.cap_mask"].shallow_clone());
    // flowtune's timestep is 1000·σ; diffusers' t is 1 − σ.
    let timestep = (-&io["input.t"] + 1.0) * 1000.0;
    let v = tch::no_grad(|| model.velocity(&io["input.x"].squeeze_dim(2), &timestep, &text))
        .expect("velocity");
    let want = -io["output.sample"].squeeze_dim(2);
    let rel = (&v - &want).norm().double_value(&[]) / want.norm().double_value(&[]);
    assert!(rel < MODEL_RTOL, "velocity vs diffusers: {rel}");
}

#[test]
fn unsupported_configs_are_named() {
    let mut config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir().join("z_image_tiny/config.json")).unwrap(),
    )
    .unwrap();
    config["siglip_feat_dim"] = 8.into();
    let parsed = serde_json::from_value(config).unwrap();
    let err = ZImageTransformer::new(&parsed, Device::Cpu, Kind::Float, None)
        .err()
        .expect("omni is refused");
    assert!(err.to_string().contains("siglip_feat_dim"), "{err}");
}

#[test]
fn a_missing_tensor_is_named() {
    let src = dir().join("z_image_tiny");
    let tmp = flowtune_fixtures::scratch("z-image-bad");
    std::fs::copy(src.join("config.json"), tmp.join("config.json")).unwrap();
    let weights = "diffusion_pytorch_model.safetensors";
    let mut tensors = Tensor::read_safetensors(src.join(weights)).unwrap();
    let dropped = "context_refiner.0.attention.norm_k.weight";
    tensors.retain(|(name, _)| name != dropped);
    Tensor::write_safetensors(&tensors, tmp.join(weights)).unwrap();
    let err = ZImageTransformer::load(&tmp, Device::Cpu, Kind::Float, None)
        .err()
        .expect("a checkpoint without a tensor is refused");
    assert!(err.to_string().contains(dropped), "{err}");
}
