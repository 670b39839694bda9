//! Wan parity with diffusers and transformers over the `wan_*` fixtures of `manifest.json`
//! (`scripts/reference_wan.py`): the transformer with and without LoRA and its LoRA gradients
//! (per-sample and Wan2.2-TI2V per-token timesteps; 1, 2 and 3 latent frames), the Wan2.1 and
//! Wan2.2 VAEs' encode and decode on 1, 5 and 9 frames, UMT5's hidden states under the prompt mask
//! and WanPipeline's zero-padded prompt embeds, and refused configs.

mod common;

use std::collections::{BTreeMap, HashMap};

use flowtune_fixtures::{dir, json, models_of_kind, tensors, Checker, MATH_RTOL, MODEL_RTOL};
use flowtune_models::text_encoders::t5::T5Encoder;
use flowtune_models::wan::{
    prompt_embeds, write_tiny_wan, AutoencoderKlWan, TinyWanSpec, WanTextEncoder, WanTransformer,
    WanTransformerConfig, WanVaeConfig, MAX_SEQUENCE_LENGTH,
};
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
        let err = WanTransformer::new(&parsed, Device::Cpu, Kind::Float, None)
            .err()
            .expect("I2V is refused");
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
        .expect_err("refused");
    assert!(err.to_string().contains("per token"), "{err}");
}

/// Each `wan_vae` fixture: per frame count T, the normalised posterior mean and the log-variance
/// of `t{T}.input.video`, and the decoded `t{T}.input.latents`.
#[test]
fn wan_vaes_match_diffusers() {
    let mut check = Checker::new("manifest.json wan_vae");
    for entry in models_of_kind("wan_vae") {
        check.case();
        let name = entry["name"].as_str().expect("name");
        let model_dir = dir().join(entry["model"].as_str().expect("model"));
        let vae = AutoencoderKlWan::load(&model_dir, Device::Cpu, Kind::Float).expect("load");
        let io = tensors(&format!("{name}_io.safetensors"));
        let c = &vae.config;
        let stat = |v: &[f64]| Tensor::from_slice(v).to_kind(Kind::Float).view([1, -1, 1, 1, 1]);
        for t in entry["frames"].as_array().expect("frames") {
            let key = |k: &str| format!("t{t}.{k}");
            let (latents, logvar) =
                tch::no_grad(|| vae.encode_video(&io[&key("input.video")])).expect("encode");
            let want = (&io[&key("output.mean")] - stat(&c.latents_mean)) / stat(&c.latents_std);
            check.close_within(
                &format!("{name} {}", key("mean (normalised)")),
                &latents,
                &want,
                MATH_RTOL,
            );
            let want = &io[&key("output.logvar")];
            check.close_within(
                &format!("{name} {}", key("output.logvar")),
                &logvar,
                want,
                MATH_RTOL,
            );
            let video =
                tch::no_grad(|| vae.decode_video(&io[&key("input.latents")])).expect("decode");
            let want = &io[&key("output.video")];
            check.close_within(&format!("{name} {}", key("output.video")), &video, want, MATH_RTOL);
        }
    }
    check.finish();
}

#[test]
fn inconsistent_vae_configs_are_explained() {
    let wan22: WanVaeConfig = serde_json::from_str(
        &std::fs::read_to_string(dir().join("wan22_vae_tiny/config.json")).unwrap(),
    )
    .unwrap();
    let wrong_scale = WanVaeConfig { scale_factor_spatial: Some(8), ..wan22.clone() };
    let err = AutoencoderKlWan::new(&wrong_scale, Device::Cpu, Kind::Float).err().expect("refused");
    assert!(err.to_string().contains("scale_factor_spatial"), "{err}");
    let uneven = WanVaeConfig { base_dim: 3, dim_mult: vec![1, 3, 2, 2], ..wan22 };
    let err = AutoencoderKlWan::new(&uneven, Device::Cpu, Kind::Float).err().expect("refused");
    assert!(err.to_string().contains("is_residual"), "{err}");
}

/// UMT5 (a position bias in every block) under the attention mask, and the prompt embeds padded
/// with zeros beyond each prompt up to max_sequence_length.
#[test]
fn umt5_matches_transformers() {
    let mut check = Checker::new("manifest.json wan_umt5");
    for entry in models_of_kind("wan_umt5") {
        check.case();
        let name = entry["name"].as_str().expect("name");
        let model_dir = dir().join(entry["model"].as_str().expect("model"));
        let encoder = T5Encoder::load(&model_dir, Device::Cpu, Kind::Float).expect("load");
        assert!(encoder.config.bias_per_block(), "{name} is UMT5");
        let io = tensors(&format!("{name}_io.safetensors"));
        let (ids, mask) = (&io["input.input_ids"], &io["input.attention_mask"]);
        let hidden = tch::no_grad(|| encoder.forward_masked(ids, Some(mask))).expect("forward");
        let want = &io["output.last_hidden_state"];
        check.close_within(&format!("{name} last_hidden_state"), &hidden, want, MATH_RTOL);
        let length = entry["max_sequence_length"].as_i64().expect("max_sequence_length");
        let embeds =
            tch::no_grad(|| prompt_embeds(&encoder, ids, mask, length)).expect("prompt embeds");
        let want = &io["output.prompt_embeds"];
        check.close_within(&format!("{name} prompt_embeds"), &embeds, want, MATH_RTOL);
    }
    check.finish();
}

/// `make-tiny wan` (both VAE styles): every component loads here and one denoising pass runs
/// from prompt to decoded video; diffusers loading and running it is
/// `scripts/reference_wan.py --check-pipeline`.
#[test]
fn tiny_pipelines_load_and_run() {
    for wan21 in [false, true] {
        let d = flowtune_fixtures::scratch(&format!("wan-tiny-{wan21}"));
        write_tiny_wan(&d, &TinyWanSpec { wan21, ..Default::default() }).expect("write");
        let (cpu, f32) = (Device::Cpu, Kind::Float);
        let text = WanTextEncoder::load(&d.join("tokenizer"), &d.join("text_encoder"), cpu, f32)
            .expect("text encoder");
        let (embeds, mask) = tch::no_grad(|| text.encode(&["a red  ball", ""])).expect("encode");
        assert_eq!(embeds.size()[1], MAX_SEQUENCE_LENGTH as i64);
        let valid = mask.sum_dim_intlist(1, false, Kind::Int64);
        let beyond = embeds.get(0).narrow(0, valid.int64_value(&[0]), 4).abs().max();
        assert_eq!(beyond.double_value(&[]), 0.0, "positions beyond the prompt are zero");
        let transformer =
            WanTransformer::load(&d.join("transformer"), cpu, f32, None).expect("transformer");
        let vae = AutoencoderKlWan::load(&d.join("vae"), cpu, f32).expect("vae");
        let z = vae.config.z_dim;
        let latents = Tensor::randn([2, z, 2, 2, 4], (f32, cpu));
        let t = Tensor::from_slice(&[900.0f32, 900.0]);
        let v = tch::no_grad(|| transformer.forward(&latents, &t, &embeds)).expect("forward");
        assert_eq!(v.size(), latents.size());
        let video = tch::no_grad(|| vae.decode_video(&(latents - v * 0.9))).expect("decode");
        let s = vae.config.spatial_factor();
        assert_eq!(video.size(), [2, 3, 5, 2 * s, 4 * s]);
    }
}

/// The released layouts (Wan2.1's and Wan2.2's VAEs, Wan2.2-TI2V-5B's transformer with one
/// block) have diffusers' parameter names and shapes (`wan_real_shapes.json`).
#[test]
fn released_layouts_match_diffusers_names_and_shapes() {
    let real = json("wan_real_shapes.json");
    for (name, entry) in real.as_object().expect("an object of layouts") {
        let want: BTreeMap<String, Vec<i64>> =
            serde_json::from_value(entry["shapes"].clone()).expect("shapes");
        let config = entry["config"].clone();
        let vars = match entry["class"].as_str().expect("class") {
            "AutoencoderKLWan" => {
                let config: WanVaeConfig = serde_json::from_value(config).expect("config");
                AutoencoderKlWan::new(&config, Device::Cpu, Kind::Float)
                    .expect("build")
                    .store
                    .variables()
            }
            _ => {
                let config: WanTransformerConfig = serde_json::from_value(config).expect("config");
                let model =
                    WanTransformer::new(&config, Device::Cpu, Kind::Float, None).expect("build");
                model.weights.base.variables()
            }
        };
        let ours: BTreeMap<String, Vec<i64>> =
            vars.into_iter().map(|(n, t)| (n, t.size())).collect();
        assert_eq!(ours, want, "{name}");
    }
}

/// bf16 weights run (per-sample and per-token timesteps, the Wan2.2 VAE) and stay near the f32
/// reference.
#[test]
fn bf16_stays_close() {
    let rel = |a: &Tensor, b: &Tensor| {
        let a = a.to_kind(Kind::Float);
        (&a - b).norm().double_value(&[]) / b.norm().double_value(&[])
    };
    for name in ["wan_t2v_tiny", "wan_ti2v_tiny"] {
        let io = tensors(&format!("{name}_io.safetensors"));
        let model = WanTransformer::load(&dir().join(name), Device::Cpu, Kind::BFloat16, None)
            .expect("load");
        let out = tch::no_grad(|| forward(&model, &io));
        assert_eq!(out.kind(), Kind::BFloat16);
        let err = rel(&out, &io["output.sample"]);
        eprintln!("{name} bf16: relative error {err:.2e}");
        assert!(err < 3e-2, "{name} bf16 vs f32 reference: {err}");
    }
    let name = "wan22_vae_tiny";
    let io = tensors(&format!("{name}_io.safetensors"));
    let vae = AutoencoderKlWan::load(&dir().join(name), Device::Cpu, Kind::BFloat16).expect("load");
    let video = tch::no_grad(|| vae.decode_video(&io["t5.input.latents"])).expect("decode");
    let err = rel(&video, &io["t5.output.video"]);
    eprintln!("{name} bf16 decode: relative error {err:.2e}");
    assert!(err < 3e-2, "{name} bf16 decode vs f32 reference: {err}");
}

/// A per-token timestep equal on every token (WanPipeline with `expand_timesteps` and no
/// condition frame) gives the per-sample forward: text-to-video needs no per-token path.
#[test]
fn a_constant_per_token_timestep_is_the_per_sample_one() {
    let name = "wan_ti2v_tiny";
    let io = tensors(&format!("{name}_io.safetensors"));
    let model =
        WanTransformer::load(&dir().join(name), Device::Cpu, Kind::Float, None).expect("load");
    let x = &io["input.hidden_states"];
    let text = &io["input.encoder_hidden_states"];
    let tokens = io["input.timestep"].size()[1];
    let t = Tensor::from_slice(&[700.0f32, 125.0]);
    let per_token = t.unsqueeze(1).expand([2, tokens], false).contiguous();
    let (a, b) = tch::no_grad(|| {
        (
            model.forward(x, &t, text).expect("per sample"),
            model.forward(x, &per_token, text).expect("per token"),
        )
    });
    let rel = (&a - &b).norm().double_value(&[]) / b.norm().double_value(&[]);
    // Two code paths (the timestep MLP over 2 rows or 2 × tokens rows): f32 rounding apart.
    assert!(rel < 1e-5, "per-sample vs constant per-token: {rel}");
}
