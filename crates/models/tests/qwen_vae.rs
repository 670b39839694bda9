//! `AutoencoderKLQwenImage` parity with diffusers over every `qwen_vae` fixture of
//! `manifest.json` (from `scripts/reference_qwen_vae.py`), the tiny writer, and loading errors.

use flowtune_fixtures::{dir, models_of_kind, scratch, tensors, Checker, MATH_RTOL};
use flowtune_models::qwen_image::{write_tiny_qwen_vae, AutoencoderKlQwenImage, QwenVaeConfig};
use flowtune_models::ModelError;
use tch::{Device, Kind, Tensor};

fn each(mut run: impl FnMut(&mut Checker, &str, &AutoencoderKlQwenImage)) {
    let mut check = Checker::new("manifest.json qwen_vae");
    for entry in models_of_kind("qwen_vae") {
        check.case();
        let name = entry["name"].as_str().expect("name");
        let model_dir = dir().join(entry["model"].as_str().expect("model"));
        let vae = AutoencoderKlQwenImage::load(&model_dir, Device::Cpu, Kind::Float).expect("load");
        run(&mut check, name, &vae);
    }
    check.finish();
}

fn io(name: &str) -> std::collections::HashMap<String, Tensor> {
    tensors(&format!("{name}_io.safetensors"))
}

#[test]
fn decode_matches_diffusers() {
    each(|check, name, vae| {
        let io = io(name);
        let image = tch::no_grad(|| vae.decode(&io["input.latents"]));
        check.close_within(&format!("{name} output.image"), &image, &io["output.image"], MATH_RTOL);
        let video = tch::no_grad(|| vae.decode_video(&io["input.video_latents"]));
        check.close_within(&format!("{name} output.video"), &video, &io["output.video"], MATH_RTOL);
    });
}

#[test]
fn encode_matches_diffusers() {
    each(|check, name, vae| {
        let io = io(name);
        let (latents, logvar) = tch::no_grad(|| vae.encode(&io["input.image"]));
        let pairs = [("output.image_latents", &latents), ("output.logvar", &logvar)];
        for (key, t) in pairs {
            check.close_within(&format!("{name} {key}"), t, &io[key], MATH_RTOL);
        }
        // Undoing the normalisation gives diffusers' raw posterior mean.
        let c = &vae.config;
        let stat = |v: &[f64]| Tensor::from_slice(v).to_kind(Kind::Float).view([1, -1, 1, 1]);
        let raw = &latents * stat(&c.latents_std) + stat(&c.latents_mean);
        check.close_within(&format!("{name} output.mean"), &raw, &io["output.mean"], MATH_RTOL);
        let (video, _) = tch::no_grad(|| vae.encode_video(&io["input.video"]));
        let shape = [1, -1, 1, 1, 1];
        let raw = video * stat(&c.latents_std).view(shape) + stat(&c.latents_mean).view(shape);
        check.close_within(
            &format!("{name} output.video_mean"),
            &raw,
            &io["output.video_mean"],
            MATH_RTOL,
        );
    });
}

#[test]
fn tiny_writer_round_trips() {
    let d = scratch("tiny");
    let config = QwenVaeConfig::tiny();
    write_tiny_qwen_vae(&d, 3, &config).expect("write");
    let vae = AutoencoderKlQwenImage::load(&d, Device::Cpu, Kind::Float).expect("load");
    assert_eq!(vae.config, config);
    let latents = Tensor::randn([1, 16, 2, 3], (Kind::Float, Device::Cpu));
    let image = tch::no_grad(|| vae.decode(&latents));
    assert_eq!(image.size(), [1, 3, 16, 24]);
    let (again, logvar) = tch::no_grad(|| vae.encode(&image));
    assert_eq!(again.size(), [1, 16, 2, 3]);
    assert_eq!(logvar.size(), [1, 16, 2, 3]);
    let rgb = AutoencoderKlQwenImage::to_rgb8(&image);
    assert_eq!((rgb.size(), rgb.kind()), (vec![1, 16, 24, 3], Kind::Uint8));
    // The same seed writes the same weights.
    let again_dir = scratch("tiny-again");
    write_tiny_qwen_vae(&again_dir, 3, &config).expect("write");
    let file = "diffusion_pytorch_model.safetensors";
    let (a, b) =
        (std::fs::read(d.join(file)).unwrap(), std::fs::read(again_dir.join(file)).unwrap());
    assert!(a == b, "seeded writes differ");
}

#[test]
fn misshaped_tensor_is_named() {
    let d = scratch("misshaped");
    write_tiny_qwen_vae(&d, 4, &QwenVaeConfig::tiny()).expect("write");
    let file = d.join("diffusion_pytorch_model.safetensors");
    let key = "decoder.up_blocks.1.resnets.0.conv1.weight";
    let mut weights = Tensor::read_safetensors(&file).unwrap();
    let entry = weights.iter_mut().find(|(n, _)| n == key).expect("key in tiny checkpoint");
    let expected = entry.1.size();
    entry.1 = entry.1.narrow(1, 0, expected[1] - 1).contiguous();
    Tensor::write_safetensors(&weights, &file).unwrap();
    let err = AutoencoderKlQwenImage::load(&d, Device::Cpu, Kind::Float)
        .err()
        .expect("a misshaped tensor must not load");
    match &err {
        ModelError::Shape { name, expected: e, .. } => {
            assert_eq!((name.as_str(), e), (key, &expected));
        }
        other => panic!("expected a shape error, got {other}"),
    }
    let message = err.to_string();
    assert!(message.contains(key) && message.contains("diffusion_pytorch_model"), "{message}");
}

#[test]
fn inconsistent_config_is_explained() {
    let d = scratch("config");
    let config = QwenVaeConfig { temperal_downsample: vec![false, true], ..QwenVaeConfig::tiny() };
    std::fs::create_dir_all(&d).unwrap();
    flowtune_models::write_json(&d.join("config.json"), &config).unwrap();
    let err = AutoencoderKlQwenImage::load(&d, Device::Cpu, Kind::Float).err().expect("rejected");
    let message = err.to_string();
    assert!(
        message.contains("config.json") && message.contains("temperal_downsample"),
        "{message}"
    );
}

/// The default config (Qwen-Image's) builds exactly diffusers' tensors and shapes.
#[test]
fn default_tree_matches_diffusers() {
    let expected = flowtune_fixtures::json("qwen_vae_default_shapes.json");
    let expected: std::collections::BTreeMap<String, Vec<i64>> =
        serde_json::from_value(expected).expect("name → shape");
    let vae = AutoencoderKlQwenImage::new(&QwenVaeConfig::default(), Device::Cpu, Kind::Float)
        .expect("build");
    let built: std::collections::BTreeMap<String, Vec<i64>> =
        vae.store.variables().into_iter().map(|(name, t)| (name, t.size())).collect();
    assert_eq!(built, expected);
}

/// Loaded in bf16, pictures still decode and encode close to the f32 reference (bf16 keeps 8 bits
/// of mantissa: a few percent through a dozen random layers).
#[test]
fn bf16_stays_close() {
    let entry = &models_of_kind("qwen_vae")[0];
    let name = entry["name"].as_str().expect("name");
    let model_dir = dir().join(entry["model"].as_str().expect("model"));
    let vae = AutoencoderKlQwenImage::load(&model_dir, Device::Cpu, Kind::BFloat16).expect("load");
    assert_eq!((vae.decoder_kind(), vae.encoder_kind()), (Kind::BFloat16, Kind::BFloat16));
    let io = io(name);
    let mut check = Checker::new("qwen_vae bf16");
    check.case();
    let image = tch::no_grad(|| vae.decode(&io["input.latents"]));
    assert_eq!(image.kind(), Kind::BFloat16);
    check.close_within("bf16 output.image", &image, &io["output.image"], 5e-2);
    let (latents, _) = tch::no_grad(|| vae.encode(&io["input.image"]));
    check.close_within("bf16 output.image_latents", &latents, &io["output.image_latents"], 5e-2);
    check.finish();
}
