//! VAE, CLIP and T5 parity with diffusers/transformers over every `vae`, `clip_text` and
//! `t5_encoder` fixture of `manifest.json`.

use flowtune_fixtures::{dir, models_of_kind, tensors, Checker, MODEL_RTOL};
use flowtune_models::text_encoders::{clip::ClipTextModel, t5::T5Encoder};
use flowtune_models::vae::AutoencoderKl;
use tch::{Device, Kind};

fn each(kind: &str, mut run: impl FnMut(&mut Checker, &str, std::path::PathBuf)) {
    let mut check = Checker::new(&format!("manifest.json {kind}"));
    for entry in models_of_kind(kind) {
        check.case();
        let name = entry["name"].as_str().expect("name");
        run(&mut check, name, dir().join(entry["model"].as_str().expect("model")));
    }
    check.finish();
}

#[test]
fn vae_decode_matches_diffusers() {
    each("vae", |check, name, model_dir| {
        let io = tensors(&format!("{name}_io.safetensors"));
        let vae = AutoencoderKl::load(&model_dir, Device::Cpu, Kind::Float).expect("load");
        let image = tch::no_grad(|| vae.decode(&io["input.latents"]));
        check.close_within(
            &format!("{name} output.image"),
            &image,
            &io["output.image"],
            MODEL_RTOL,
        );
    });
}

/// Encoder fixtures (`<name>_encode_io.safetensors`, from `scripts/reference_vae_encode.py`) are
/// checked for every VAE that has one.
#[test]
fn vae_encode_matches_diffusers() {
    each("vae", |check, name, model_dir| {
        let file = format!("{name}_encode_io.safetensors");
        if !dir().join(&file).exists() {
            return;
        }
        let io = tensors(&file);
        let vae = AutoencoderKl::load(&model_dir, Device::Cpu, Kind::Float).expect("load");
        let (latents, logvar) = tch::no_grad(|| vae.encode(&io["input.image"]));
        let c = &vae.config;
        let mean = latents / c.scaling_factor + c.shift_factor.unwrap_or(0.0);
        check.close_within(&format!("{name} output.mean"), &mean, &io["output.mean"], MODEL_RTOL);
        check.close_within(
            &format!("{name} output.logvar"),
            &logvar,
            &io["output.logvar"],
            MODEL_RTOL,
        );
    });
}

#[test]
fn clip_matches_transformers() {
    each("clip_text", |check, name, model_dir| {
        let io = tensors(&format!("{name}_io.safetensors"));
        let clip = ClipTextModel::load(&model_dir, Device::Cpu, Kind::Float).expect("load");
        let out = tch::no_grad(|| clip.forward(&io["input.input_ids"])).expect("forward");
        for (key, t) in [
            ("output.text_embeds", out.text_embeds.as_ref().expect("with projection")),
            ("output.last_hidden_state", &out.last_hidden_state),
            ("output.penultimate_hidden_state", &out.penultimate_hidden_state),
        ] {
            check.close_within(&format!("{name} {key}"), t, &io[key], MODEL_RTOL);
        }
    });
}

#[test]
fn t5_matches_transformers() {
    each("t5_encoder", |check, name, model_dir| {
        let io = tensors(&format!("{name}_io.safetensors"));
        let t5 = T5Encoder::load(&model_dir, Device::Cpu, Kind::Float).expect("load");
        let out = tch::no_grad(|| t5.forward(&io["input.input_ids"])).expect("forward");
        check.close_within(
            &format!("{name} output.last_hidden_state"),
            &out,
            &io["output.last_hidden_state"],
            MODEL_RTOL,
        );
    });
}
