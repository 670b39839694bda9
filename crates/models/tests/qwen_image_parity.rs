//! Qwen-Image transformer parity with diffusers over every `qwen_image_transformer` fixture of
//! `manifest.json` (`scripts/reference_qwen_image.py`): outputs with and without LoRA (reference
//! targets and `all-linear`), every LoRA gradient, and the Edit model's `zero_cond_t`.

mod common;

use std::collections::HashMap;

use flowtune_fixtures::{dir, models_of_kind, tensors, MODEL_RTOL};
use flowtune_models::qwen_image::{ImageShape, QwenImageTransformer};
use tch::{Device, Kind, Tensor};

fn forward(m: &QwenImageTransformer, io: &HashMap<String, Tensor>) -> Tensor {
    let input = |k: &str| io.get(&format!("input.{k}"));
    let shapes: Vec<ImageShape> = Vec::<i64>::try_from(input("img_shapes").unwrap().reshape([-1]))
        .unwrap()
        .chunks(3)
        .map(|s| (s[0], s[1], s[2]))
        .collect();
    m.forward(
        input("hidden_states").unwrap(),
        input("encoder_hidden_states").unwrap(),
        input("encoder_hidden_states_mask"),
        input("timestep").unwrap(),
        &shapes,
    )
    .expect("forward")
}

#[test]
fn qwen_image_transformers_match_diffusers() {
    // The last block's text outputs do not reach the image prediction.
    common::check_lora_fixtures(
        "qwen_image_transformer",
        |dir, lora| {
            QwenImageTransformer::load(dir, Device::Cpu, Kind::Float, Some(lora)).expect("load")
        },
        forward,
        true,
    );
}

#[test]
fn velocity_packs_latents_and_rescales_true_cfg_per_token() {
    use flowtune_models::{Denoiser, TextConditioning};
    let entry = &models_of_kind("qwen_image_transformer")[0];
    let name = entry["name"].as_str().unwrap();
    let io = tensors(&format!("{name}_io.safetensors"));
    let model = QwenImageTransformer::load(&dir().join(name), Device::Cpu, Kind::Float, None)
        .expect("load");
    // The fixture's packed (B, 3·5, 64) tokens are a 6 × 10 latent.
    let latents = model.unpack(&io["input.hidden_states"], 6, 10);
    assert!(model.pack(&latents).equal(&io["input.hidden_states"]));
    let mut text = TextConditioning::new(io["input.encoder_hidden_states"].shallow_clone(), None);
    text.mask = Some(io["input.encoder_hidden_states_mask"].shallow_clone());
    let v = tch::no_grad(|| model.velocity(&latents, &(&io["input.timestep"] * 1000.0), &text))
        .expect("velocity");
    let want = model.unpack(&io["output.sample"], 6, 10);
    let rel = (&v - &want).norm().double_value(&[]) / want.norm().double_value(&[]);
    assert!(rel < MODEL_RTOL, "velocity vs diffusers: {rel}");

    // True CFG keeps each packed token at the conditional prediction's norm.
    let (cond, uncond) = (Tensor::randn([2, 16, 6, 10], (Kind::Float, Device::Cpu)), want);
    let guided = model.combine_guidance(&cond, &uncond, 4.0);
    let norms = |t: &Tensor| model.pack(t).norm_scalaropt_dim(2, [-1], false);
    let rel = (norms(&guided) - norms(&cond)).abs().max().double_value(&[]);
    assert!(rel < 1e-4, "per-token norms differ by {rel}");
    let plain = &uncond + (&cond - &uncond) * 4.0;
    let cos = (model.pack(&guided) * model.pack(&plain)).sum_dim_intlist(
        &[-1i64][..],
        false,
        Kind::Float,
    ) / (norms(&guided) * norms(&plain));
    assert!((cos - 1.0).abs().max().double_value(&[]) < 1e-5, "rescaling changes directions");
}

#[test]
fn bad_checkpoints_and_configs_are_named() {
    let src = dir().join("qwen_image_tiny");
    let tmp = flowtune_fixtures::scratch("qwen-bad");
    let weights = "diffusion_pytorch_model.safetensors";
    let mut tensors = Tensor::read_safetensors(src.join(weights)).unwrap();
    let dropped = "transformer_blocks.1.attn.norm_added_k.weight";
    tensors.retain(|(name, _)| name != dropped);
    Tensor::write_safetensors(&tensors, tmp.join(weights)).unwrap();
    std::fs::copy(src.join("config.json"), tmp.join("config.json")).unwrap();
    let err = QwenImageTransformer::load(&tmp, Device::Cpu, Kind::Float, None)
        .err()
        .expect("a missing tensor fails")
        .to_string();
    assert!(err.contains(dropped) && err.contains(weights), "{err}");

    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["guidance_embeds"] = true.into();
    std::fs::write(tmp.join("config.json"), config.to_string()).unwrap();
    let err = QwenImageTransformer::load(&tmp, Device::Cpu, Kind::Float, None)
        .err()
        .expect("guidance_embeds is refused")
        .to_string();
    assert!(err.contains("guidance_embeds"), "{err}");
    config["guidance_embeds"] = false.into();
    config["axes_dims_rope"] = serde_json::json!([4, 6, 8]);
    std::fs::write(tmp.join("config.json"), config.to_string()).unwrap();
    let err = QwenImageTransformer::load(&tmp, Device::Cpu, Kind::Float, None)
        .err()
        .expect("rotary axes that do not fill a head are refused")
        .to_string();
    assert!(err.contains("axes_dims_rope") && err.contains("16"), "{err}");
}
