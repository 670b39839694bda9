//! Wan parity with diffusers and transformers over the `wan_*` fixtures of `manifest.json`
//! (`scripts/reference_wan.py`): the transformer with and without LoRA and its LoRA gradients
//! (per-sample and Wan2.2-TI2V per-token timesteps; 1, 2 and 3 latent frames), and refused
//! configs.

mod common;

use std::collections::HashMap;

use flowtune_fixtures::{dir, models_of_kind, tensors, MODEL_RTOL};
use flowtune_models::wan::{WanTransformer, WanTransformerConfig};
use flowtune_models::{Denoiser, TextConditioning, TrainableDenoiser};
use tch::{Device, Kind, Tensor};

fn forward(m: &WanTransformer, io: &HashMap<String, Tensor>) -> Tensor {
    let named: HashMap<String, Tensor> = io
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("input.").map(|k| (k.to_string(), v.shallow_clone())))
        .collect();
    m.forward_named(&named).expect("forward")
}

#[test]
fn wan_transformers_match_diffusers() {
    common::check_lora_fixtures(
        "wan_transformer",
        |dir, lora| WanTransformer::load(dir, Device::Cpu, Kind::Float, Some(lora)).expect("load"),
        forward,
        false,
    );
}

#[test]
fn velocity_is_the_forward_at_the_pipeline_timestep() {
    let entry = &models_of_kind("wan_transformer")[0];
    let name = entry["name"].as_str().unwrap();
    let io = tensors(&format!("{name}_io.safetensors"));
    let model =
        WanTransformer::load(&dir().join(name), Device::Cpu, Kind::Float, None).expect("load");
    let text = TextConditioning::new(io["input.encoder_hidden_states"].shallow_clone(), None);
    let v =
        tch::no_grad(|| model.velocity(&io["input.hidden_states"], &io["input.timestep"], &text))
            .expect("velocity");
    let want = &io["output.sample"];
    let rel = (&v - want).norm().double_value(&[]) / want.norm().double_value(&[]);
    assert!(rel < MODEL_RTOL, "velocity vs diffusers: {rel}");
}

#[test]
fn image_conditioning_configs_are_refused_by_key() {
    for key in ["image_dim", "added_kv_proj_dim"] {
        let mut config: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir().join("wan_t2v_tiny/config.json")).unwrap(),
        )
        .unwrap();
        config[key] = 8.into();
        let parsed: WanTransformerConfig = serde_json::from_value(config).unwrap();
        let err = WanTransformer::new(&parsed, Device::Cpu, None).err().expect("I2V is refused");
        assert!(err.to_string().contains(key), "{err}");
    }
}

#[test]
fn a_timestep_of_the_wrong_shape_is_refused() {
    let name = "wan_t2v_tiny";
    let io = tensors(&format!("{name}_io.safetensors"));
    let model =
        WanTransformer::load(&dir().join(name), Device::Cpu, Kind::Float, None).expect("load");
    let t = Tensor::zeros([2, 7], (Kind::Float, Device::Cpu));
    let err = model
        .forward(&io["input.hidden_states"], &t, &io["input.encoder_hidden_states"])
        .err()
        .expect("refused");
    assert!(err.to_string().contains("per token"), "{err}");
}
