//! Qwen-Image 2.1 parity with diffusers (`scripts/reference_qwen_image21.py`): the transformer
//! over every `qwen_image21_transformer` fixture of `manifest.json` (condition images between
//! text, masked prompts of different lengths, non-square targets, with and without
//! `causal_condition`; outputs with and without LoRA, every LoRA gradient), `velocity` on
//! latents, and the VAE's encoding and decoding.

mod common;

use std::collections::HashMap;

use flowtune_fixtures::{dir, models_of_kind, tensors, Checker, MODEL_RTOL};
use flowtune_models::qwen_image::{CONDITION_LATENTS, CONDITION_SHAPES};
use flowtune_models::qwen_image21::{
    AutoencoderKlQwenImage21, QwenImage21Transformer, IMAGE_SLOTS, QWEN_IMAGE21_TARGETS,
};
use flowtune_models::{Denoiser, TextConditioning, TrainableDenoiser};
use tch::{Device, Kind, Tensor};

fn forward(m: &QwenImage21Transformer, io: &HashMap<String, Tensor>) -> Tensor {
    let inputs: HashMap<String, Tensor> = io
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("input.").map(|k| (k.to_string(), v.shallow_clone())))
        .collect();
    m.forward_named(&inputs).expect("forward")
}

#[test]
fn qwen_image21_transformers_match_diffusers() {
    common::check_lora_fixtures(
        "qwen_image21_transformer",
        |dir, lora| {
            if !dir.ends_with("qwen_image21_t2i") {
                assert_eq!(lora.target_modules, QWEN_IMAGE21_TARGETS, "the reference's targets");
            }
            QwenImage21Transformer::load(dir, Device::Cpu, Kind::Float, Some(lora)).expect("load")
        },
        forward,
        false,
    );
}

/// `velocity` on (B, C, H, W) latents: condition tokens, their grids and slots from the extras,
/// the target's slots appended, the target's velocity kept.
#[test]
fn velocity_takes_latents_and_condition_images() {
    for entry in models_of_kind("qwen_image21_transformer") {
        let name = entry["name"].as_str().unwrap();
        let io = tensors(&format!("{name}_io.safetensors"));
        let model = QwenImage21Transformer::load(&dir().join(name), Device::Cpu, Kind::Float, None)
            .expect("load");
        let shapes = &io["input.img_shapes"];
        let n = shapes.size()[0];
        let target = Vec::<i64>::try_from(shapes.get(n - 1)).unwrap();
        let (h, w) = (target[1], target[2]);
        let tokens = &io["input.hidden_states"];
        let (b, s, c) = tokens.size3().unwrap();
        let cells = h * w;
        let to_latents = |t: &Tensor| {
            t.narrow(1, t.size()[1] - cells, cells).transpose(1, 2).reshape([b, c, h, w])
        };
        let embeds = &io["input.encoder_hidden_states"];
        let l = embeds.size()[1];
        let mut text = TextConditioning::new(embeds.shallow_clone(), None);
        text.mask = io.get("input.encoder_hidden_states_mask").map(|m| m.shallow_clone());
        if n > 1 {
            text.extras.insert(CONDITION_LATENTS.into(), tokens.narrow(1, 0, s - cells));
            let grids = shapes.narrow(0, 0, n - 1).unsqueeze(0).expand([b, -1, -1], false);
            text.extras.insert(CONDITION_SHAPES.into(), grids);
            text.extras.insert(IMAGE_SLOTS.into(), io["input.img_mask"].narrow(1, 0, l));
        }
        let t = &io["input.timestep"] * 1000.0;
        let v = tch::no_grad(|| model.velocity(&to_latents(tokens), &t, &text)).expect("velocity");
        let want = to_latents(&io["output.sample"]);
        let rel = (&v - &want).norm().double_value(&[]) / want.norm().double_value(&[]);
        assert!(rel < MODEL_RTOL, "{name}: velocity vs diffusers: {rel}");
    }
}

/// The tiny `AutoencoderKLQwenImage21` (2-D convolutions, residual levels, RGBA): u8 pictures
/// encoded as `_encode_vae_image` returns them, latents decoded as the pipeline decodes them.
#[test]
fn vae_matches_the_pipeline() {
    let io = tensors("qwen_image21_vae_io.safetensors");
    let vae =
        AutoencoderKlQwenImage21::load(&dir().join("qwen_image21_vae"), Device::Cpu, Kind::Float)
            .expect("load");
    let mut check = Checker::new("qwen_image21_vae_io.safetensors");
    check.case();
    let pictures = io["input.pixels"].permute([0, 3, 1, 2]).to_kind(Kind::Float) / 127.5 - 1.0;
    let encoded = tch::no_grad(|| vae.encode(&pictures));
    check.close_within("encoded_latents", &encoded, &io["output.encoded_latents"], MODEL_RTOL);
    let decoded = tch::no_grad(|| vae.decode(&io["input.decode_latents"]));
    let want = &io["output.decoded"];
    let saturated = want.abs().ge(1.0).to_kind(Kind::Float).mean(Kind::Float).double_value(&[]);
    assert!(saturated < 0.5, "the reference picture is mostly clamped ({saturated})");
    check.close_within("decoded", &decoded, want, MODEL_RTOL);
    check.finish();
}
