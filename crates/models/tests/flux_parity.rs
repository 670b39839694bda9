//! FLUX.1 transformer parity with diffusers over every `flux_transformer` fixture of
//! `manifest.json` (`scripts/reference_flux.py`): [dev] with its guidance embedding and
//! [schnell] without, outputs with and without LoRA (reference targets and `all-linear`), every
//! LoRA gradient, and `velocity` on unpacked latents.

mod common;

use std::collections::HashMap;

use flowtune_fixtures::{dir, models_of_kind, tensors, MODEL_RTOL};
use flowtune_models::flux::{FluxTransformer, GUIDANCE};
use flowtune_models::lora::FLUX_TARGETS;
use flowtune_models::packing::{pack, unpack};
use flowtune_models::{Denoiser, TextConditioning};
use tch::{Device, Kind, Tensor};

fn forward(m: &FluxTransformer, io: &HashMap<String, Tensor>) -> Tensor {
    let input = |k: &str| io.get(&format!("input.{k}"));
    m.forward(
        input("hidden_states").unwrap(),
        input("encoder_hidden_states").unwrap(),
        input("pooled_projections").unwrap(),
        input("timestep").unwrap(),
        input("img_ids").unwrap(),
        input("txt_ids").unwrap(),
        input("guidance"),
    )
    .expect("forward")
}

#[test]
fn flux_transformers_match_diffusers() {
    common::check_lora_fixtures(
        "flux_transformer",
        |dir, lora| {
            if dir.ends_with("flux_dev_tiny") {
                assert_eq!(
                    lora.target_modules, FLUX_TARGETS,
                    "the reference uses FLUX.1's targets"
                );
            }
            FluxTransformer::load(dir, Device::Cpu, Kind::Float, Some(lora)).expect("load")
        },
        forward,
        false,
    );
}

#[test]
fn velocity_packs_latents_and_reads_the_guidance_extra() {
    for entry in models_of_kind("flux_transformer") {
        let name = entry["name"].as_str().unwrap();
        let io = tensors(&format!("{name}_io.safetensors"));
        let model =
            FluxTransformer::load(&dir().join(name), Device::Cpu, Kind::Float, None).expect("load");
        // Fixture token grids are rows × columns of the last `img_ids` row + 1.
        let last = Vec::<f32>::try_from(io["input.img_ids"].get(-1)).unwrap();
        let (h, w) = (2 * (last[1] as i64 + 1), 2 * (last[2] as i64 + 1));
        let latents = unpack(&io["input.hidden_states"], h, w, 2);
        assert!(pack(&latents, 2).equal(&io["input.hidden_states"]));
        let mut text = TextConditioning::new(
            io["input.encoder_hidden_states"].shallow_clone(),
            Some(io["input.pooled_projections"].shallow_clone()),
        );
        if let Some(g) = io.get("input.guidance") {
            text.extras.insert(GUIDANCE.into(), g.shallow_clone());
        }
        let v = tch::no_grad(|| model.velocity(&latents, &(&io["input.timestep"] * 1000.0), &text))
            .expect("velocity");
        let want = unpack(&io["output.sample"], h, w, 2);
        let rel = (&v - &want).norm().double_value(&[]) / want.norm().double_value(&[]);
        assert!(rel < MODEL_RTOL, "{name}: velocity vs diffusers: {rel}");
        if model.config.guidance_embeds {
            text.extras.clear();
            let err = model.velocity(&latents, &io["input.timestep"], &text).unwrap_err();
            assert!(err.to_string().contains("guidance"), "{err}");
        }
    }
}

#[test]
fn bad_checkpoints_and_configs_are_named() {
    let src = dir().join("flux_dev_tiny");
    let tmp = flowtune_fixtures::scratch("flux-bad");
    let weights = "diffusion_pytorch_model.safetensors";
    let mut tensors = Tensor::read_safetensors(src.join(weights)).unwrap();
    let dropped = "time_text_embed.guidance_embedder.linear_1.weight";
    tensors.retain(|(name, _)| name != dropped);
    Tensor::write_safetensors(&tensors, tmp.join(weights)).unwrap();
    std::fs::copy(src.join("config.json"), tmp.join("config.json")).unwrap();
    let err = FluxTransformer::load(&tmp, Device::Cpu, Kind::Float, None)
        .err()
        .expect("a missing tensor fails")
        .to_string();
    assert!(err.contains(dropped) && err.contains(weights), "{err}");

    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["axes_dims_rope"] = serde_json::json!([4, 6, 8]);
    std::fs::write(tmp.join("config.json"), config.to_string()).unwrap();
    let err = FluxTransformer::load(&tmp, Device::Cpu, Kind::Float, None)
        .err()
        .expect("rotary axes that do not fill a head are refused")
        .to_string();
    assert!(err.contains("axes_dims_rope") && err.contains("config.json"), "{err}");
}

#[test]
fn clip_text_model_loads_by_architecture() {
    use flowtune_models::text_encoders::clip::ClipTextModel;
    let src = dir().join("flux_pipeline/text_encoder");
    let clip = ClipTextModel::load(&src, Device::Cpu, Kind::Float).expect("CLIPTextModel");
    let ids = Tensor::from_slice(&[5i64, 9, 3, 1]).view([1, 4]);
    let out = tch::no_grad(|| clip.forward(&ids)).expect("forward");
    assert!(out.text_embeds.is_none(), "CLIPTextModel has no projection");
    assert_eq!(out.pooler_output.size(), [1, clip.config.hidden_size]);

    let tmp = flowtune_fixtures::scratch("flux-clip");
    std::fs::copy(src.join("model.safetensors"), tmp.join("model.safetensors")).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["architectures"] = serde_json::json!(["CLIPVisionModel"]);
    std::fs::write(tmp.join("config.json"), config.to_string()).unwrap();
    let err =
        ClipTextModel::load(&tmp, Device::Cpu, Kind::Float).err().expect("refused").to_string();
    assert!(err.contains("CLIPVisionModel") && err.contains("config.json"), "{err}");
}

#[test]
fn embedded_guidance_needs_a_guidance_embedding() {
    let options = |g| flowtune_models::PipelineOptions {
        embedded_guidance: Some(g),
        ..flowtune_models::PipelineOptions::new(Device::Cpu)
    };
    let dev = flowtune_models::load_pipeline(&dir().join("flux_pipeline"), &options(2.0));
    assert!(dev.is_ok_and(|p| p.embeds_guidance()), "FLUX.1 [dev] takes it");
    let err = flowtune_models::load_pipeline(&dir().join("z_image_pipeline"), &options(3.5))
        .err()
        .expect("Z-Image has no guidance embedding")
        .to_string();
    assert!(err.contains("ZImagePipeline has no guidance embedding"), "{err}");
}
