//! FLUX.2 parity with diffusers/transformers (`scripts/reference_flux2.py`): the transformer over
//! every `flux2_transformer` fixture of `manifest.json` ([klein] with reference-image tokens, [dev]
//! with its guidance embedding; outputs with and without LoRA, every LoRA gradient; `velocity` on
//! latents), and on the tiny pipeline of `flowtune make-tiny flux2` the prompt encoding (Qwen3
//! chat template, padding to `max_sequence_length`, hidden states 9, 18, 27), the VAE's encoding
//! and decoding; what flowtune does not run is refused by name.

mod common;

use std::collections::HashMap;

use flowtune_fixtures::{dir, models_of_kind, tensors, Checker, MODEL_RTOL};
use flowtune_models::flux::GUIDANCE;
use flowtune_models::flux2::{
    Flux2Pipeline, Flux2Transformer, FLUX2_TARGETS, REFERENCE_IDS, REFERENCE_TOKENS,
};
use flowtune_models::{Denoiser, FlowPipeline, PipelineOptions, TextConditioning};
use tch::{Device, Kind, Tensor};

fn forward(m: &Flux2Transformer, io: &HashMap<String, Tensor>) -> Tensor {
    let input = |k: &str| io.get(&format!("input.{k}"));
    m.forward(
        input("hidden_states").unwrap(),
        input("encoder_hidden_states").unwrap(),
        input("timestep").unwrap(),
        input("img_ids").unwrap(),
        input("txt_ids").unwrap(),
        input("guidance"),
    )
    .expect("forward")
}

#[test]
fn flux2_transformers_match_diffusers() {
    common::check_lora_fixtures(
        "flux2_transformer",
        |dir, lora| {
            if dir.ends_with("flux2_klein_tiny") {
                assert_eq!(
                    lora.target_modules, FLUX2_TARGETS,
                    "the reference uses FLUX.2's targets"
                );
            }
            Flux2Transformer::load(dir, Device::Cpu, Kind::Float, Some(lora)).expect("load")
        },
        forward,
        false,
    );
}

/// `velocity` on (B, C, H, W) latents: one token per cell, reference-image tokens from the
/// extras after them, [dev]'s guidance from its extra.
#[test]
fn velocity_takes_latents_reference_tokens_and_guidance() {
    for entry in models_of_kind("flux2_transformer") {
        let name = entry["name"].as_str().unwrap();
        let io = tensors(&format!("{name}_io.safetensors"));
        let model = Flux2Transformer::load(&dir().join(name), Device::Cpu, Kind::Float, None)
            .expect("load");
        let ids = &io["input.img_ids"];
        // The latent grid is the ids at time 0; reference tokens (time 10) follow.
        let latent = ids.select(1, 0).eq(0.0);
        let cells = latent.sum(Kind::Int64).int64_value(&[]);
        let last = Vec::<f32>::try_from(ids.get(cells - 1)).unwrap();
        let (h, w) = (last[1] as i64 + 1, last[2] as i64 + 1);
        let tokens = &io["input.hidden_states"];
        let (b, s, c) = tokens.size3().unwrap();
        let to_latents = |t: &Tensor| t.narrow(1, 0, cells).transpose(1, 2).reshape([b, c, h, w]);
        let mut text =
            TextConditioning::new(io["input.encoder_hidden_states"].shallow_clone(), None);
        if s > cells {
            text.extras.insert(REFERENCE_TOKENS.into(), tokens.narrow(1, cells, s - cells));
            let refs = ids.narrow(0, cells, s - cells).unsqueeze(0).expand([b, -1, -1], false);
            text.extras.insert(REFERENCE_IDS.into(), refs);
        }
        if let Some(g) = io.get("input.guidance") {
            text.extras.insert(GUIDANCE.into(), g.shallow_clone());
        }
        let t = &io["input.timestep"] * 1000.0;
        let v = tch::no_grad(|| model.velocity(&to_latents(tokens), &t, &text)).expect("velocity");
        let want = to_latents(&io["output.sample"]);
        let rel = (&v - &want).norm().double_value(&[]) / want.norm().double_value(&[]);
        assert!(rel < MODEL_RTOL, "{name}: velocity vs diffusers: {rel}");
        if model.config.guidance_embeds {
            text.extras.clear();
            let err = model.velocity(&to_latents(tokens), &t, &text).unwrap_err();
            assert!(err.to_string().contains("guidance"), "{err}");
        }
    }
}

fn tiny_pipeline() -> Flux2Pipeline {
    let options =
        PipelineOptions { max_sequence_length: Some(48), ..PipelineOptions::new(Device::Cpu) };
    Flux2Pipeline::load(&dir().join("flux2_klein_pipeline"), &options).expect("load")
}

/// Prompts of different lengths (one truncated) and the empty negative prompt in the chat
/// template, padded to `max_sequence_length`: ids, masks and the stacked Qwen3 states.
#[test]
fn prompt_encoding_matches_the_pipeline() {
    let io = tensors("flux2_klein_pipeline_io.safetensors");
    let pipe = tiny_pipeline();
    let mut check = Checker::new("flux2_klein_pipeline_io.safetensors prompts");
    let prompts = [
        "a red circle next to a blue square",
        "一只猫坐在垫子上, \"OPEN\" 24/7, with a long caption that runs past the sequence length \
         of the tiny pipeline so that this row is truncated",
    ];
    for (key, rows) in [("prompt", prompts), ("negative_prompt", [""; 2])] {
        check.case();
        let (ids, mask) =
            pipe.text.as_ref().expect("text encoder").tokenize(&rows, 48).expect("tokenize");
        assert!(ids.equal(&io[&format!("output.{key}_ids")]), "{key} ids");
        assert!(mask.equal(&io[&format!("output.{key}_mask")]), "{key} mask");
        let text = tch::no_grad(|| pipe.encode_prompts(&rows)).expect("encode");
        assert!(text.mask.is_none(), "the transformer attends to every token");
        let want = &io[&format!("output.{key}_embeds")];
        check.close_within(&format!("{key}_embeds"), &text.embeds, want, MODEL_RTOL);
    }
    let lengths =
        Vec::<i64>::try_from(io["output.prompt_mask"].sum_dim_intlist(1, false, Kind::Int64))
            .unwrap();
    assert!(lengths[0] < lengths[1] && lengths[1] == 48, "padded and truncated rows: {lengths:?}");
    check.finish();
}

/// `_encode_vae_image` of u8 pictures and the pipeline's decoding of (B, 4C, h, w) latents.
#[test]
fn vae_matches_the_pipeline() {
    let io = tensors("flux2_klein_pipeline_io.safetensors");
    let pipe = tiny_pipeline();
    let mut check = Checker::new("flux2_klein_pipeline_io.safetensors vae");
    check.case();
    let encoded = tch::no_grad(|| pipe.encode_rgb8(&io["input.pixels"])).expect("encode");
    check.close_within("encoded_latents", &encoded, &io["output.encoded_latents"], MODEL_RTOL);
    let decoded = tch::no_grad(|| pipe.vae.decode(&io["input.decode_latents"]));
    check.close_within("decoded", &decoded, &io["output.decoded"], MODEL_RTOL);
    // The tiny VAE downsamples 2×, a latent token covers 2 × 2 cells.
    assert_eq!(pipe.latent_shape(32, 48).unwrap(), [pipe.transformer.config.in_channels, 8, 12]);
    let err = pipe.latent_shape(32, 42).unwrap_err().to_string();
    assert!(err.contains("42: expected a positive multiple of 4"), "{err}");
    check.finish();
}

/// The fixture's reference picture `i` (H, W, 3).
fn reference_picture(io: &HashMap<String, Tensor>, i: usize) -> image::RgbImage {
    let t = &io[&format!("input.reference_{i}")];
    let (h, w) = (t.size()[0] as u32, t.size()[1] as u32);
    image::RgbImage::from_raw(w, h, Vec::<u8>::try_from(t.flatten(0, -1)).unwrap()).unwrap()
}

/// Two reference pictures, centre-cropped to the token side, encoded and laid out after each
/// other with their time coordinates, as `prepare_image_latents` does; every row shares them.
#[test]
fn reference_images_match_the_pipeline() {
    let io = tensors("flux2_klein_pipeline_io.safetensors");
    let pipe = tiny_pipeline();
    let pictures = [reference_picture(&io, 0), reference_picture(&io, 1)];
    let mut check = Checker::new("flux2_klein_pipeline_io.safetensors reference images");
    check.case();
    let (tokens, ids) =
        tch::no_grad(|| flowtune_models::flux2::reference_tokens(&pipe.vae, &pictures)).unwrap();
    check.close_within("reference_tokens", &tokens, &io["output.reference_tokens"], MODEL_RTOL);
    assert!(ids.to_kind(Kind::Float).equal(&io["output.reference_ids"].to_kind(Kind::Float)));
    let rgba = pictures.map(|p| image::DynamicImage::ImageRgb8(p).to_rgba8());
    let text = tch::no_grad(|| pipe.encode_prompts_with_pictures(&["a", "b"], &rgba, &[]))
        .expect("encode");
    assert_eq!(text.extras[REFERENCE_TOKENS].size()[0], 2, "one copy per row");
    assert!(text.extras[REFERENCE_IDS].get(1).equal(&ids.get(0)));
    check.finish();
}

/// A scratch copy of the tiny pipeline with `edit` applied to its `model_index.json`.
fn edited_index(label: &str, edit: impl Fn(&mut serde_json::Value)) -> flowtune_fixtures::Scratch {
    let src = dir().join("flux2_klein_pipeline");
    let tmp = flowtune_fixtures::scratch(label);
    for entry in std::fs::read_dir(&src).unwrap() {
        let entry = entry.unwrap().path();
        let link = tmp.join(entry.file_name().unwrap());
        if entry.is_dir() && !link.exists() {
            std::os::unix::fs::symlink(&entry, &link).unwrap();
        }
    }
    let mut index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("model_index.json")).unwrap())
            .unwrap();
    edit(&mut index);
    std::fs::write(tmp.join("model_index.json"), index.to_string()).unwrap();
    tmp
}

#[test]
fn unsupported_parts_are_refused_by_name() {
    let options = PipelineOptions::new(Device::Cpu);
    let dev = edited_index("flux2-dev-qwen3", |i| i["_class_name"] = "Flux2Pipeline".into());
    let err = flowtune_models::load_pipeline(&dev, &options).err().expect("[dev]").to_string();
    assert!(err.contains("Mistral3ForConditionalGeneration") && err.contains("Qwen3"), "{err}");

    // A VAE whose 2×2 patches are narrower than the transformer's tokens.
    let narrow = flowtune_fixtures::scratch("flux2-narrow-vae");
    let spec =
        flowtune_models::flux2::TinyFlux2Spec { vae_latent_channels: 4, ..Default::default() };
    flowtune_models::flux2::write_tiny_flux2(&narrow, &spec).unwrap();
    let mixed = edited_index("flux2-mixed-vae", |_| {});
    std::fs::remove_file(mixed.join("vae")).unwrap();
    std::os::unix::fs::symlink(narrow.join("vae"), mixed.join("vae")).unwrap();
    let err = flowtune_models::load_pipeline(&mixed, &options).err().expect("mixed").to_string();
    assert!(
        err.contains("vae/config.json: latent_channels 4") && err.contains("in_channels is 32")
    );

    let shallow = edited_index("flux2-shallow", |_| {});
    let encoder = dir().join("flux2_klein_pipeline/text_encoder");
    std::fs::remove_file(shallow.join("text_encoder")).unwrap();
    std::fs::create_dir(shallow.join("text_encoder")).unwrap();
    // The first 20 layers of the tiny encoder.
    let weights = "model.safetensors";
    let mut tensors = Tensor::read_safetensors(encoder.join(weights)).unwrap();
    tensors.retain(|(name, _)| {
        name.strip_prefix("model.layers.")
            .and_then(|rest| rest.split('.').next()?.parse::<usize>().ok())
            .is_none_or(|layer| layer < 20)
    });
    Tensor::write_safetensors(&tensors, shallow.join("text_encoder").join(weights)).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(encoder.join("config.json")).unwrap())
            .unwrap();
    config["num_hidden_layers"] = serde_json::json!(20);
    std::fs::write(shallow.join("text_encoder/config.json"), config.to_string()).unwrap();
    let err =
        flowtune_models::load_pipeline(&shallow, &options).err().expect("shallow").to_string();
    assert!(err.contains("text_encoder/config.json") && err.contains("20 layers"), "{err}");

    let pipe = tiny_pipeline();
    let picture = image::RgbaImage::from_pixel(80, 9, image::Rgba([0, 0, 0, 255]));
    let err = pipe
        .encode_prompts_with_pictures(&["a cat"], &[picture], &[32, 8, 12])
        .err()
        .expect("a sliver of a picture")
        .to_string();
    assert!(err.contains("reference picture 0 is 80×9") && err.contains("at least 64"), "{err}");

    let src = dir().join("flux2_klein_pipeline/vae");
    let tmp = flowtune_fixtures::scratch("flux2-vae");
    let weights = "diffusion_pytorch_model.safetensors";
    std::fs::copy(src.join(weights), tmp.join(weights)).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["decoder_block_out_channels"] = serde_json::json!([8, 32]);
    std::fs::write(tmp.join("config.json"), config.to_string()).unwrap();
    let err = flowtune_models::flux2::Flux2Vae::load(&tmp, Device::Cpu, Kind::Float)
        .err()
        .expect("another decoder width")
        .to_string();
    assert!(err.contains("decoder_block_out_channels") && err.contains("config.json"), "{err}");

    let src = dir().join("flux2_klein_tiny");
    let tmp = flowtune_fixtures::scratch("flux2-axes");
    std::fs::copy(src.join(weights), tmp.join(weights)).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["axes_dims_rope"] = serde_json::json!([4, 6, 6]);
    std::fs::write(tmp.join("config.json"), config.to_string()).unwrap();
    let err = Flux2Transformer::load(&tmp, Device::Cpu, Kind::Float, None)
        .err()
        .expect("three rotary axes")
        .to_string();
    assert!(err.contains("axes_dims_rope") && err.contains("config.json"), "{err}");
}
