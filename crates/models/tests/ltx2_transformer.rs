//! LTX-2 transformer parity with diffusers over the `ltx2_transformer` fixtures of `manifest.json`
//! (`scripts/reference_ltx2_transformer.py`): an LTX-2.0 and an LTX-2.3 layout, video and audio
//! velocities with and without LoRA and the LoRA gradients (also through gradient checkpointing),
//! the joint-latent velocity and the pipeline's packing, bf16, the saved LoRA, the random writer,
//! the released layouts' names and shapes, and refused configs.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use flowtune_fixtures::{dir, models_of_kind, scratch, tensors, Checker};
use flowtune_models::lora::LoraConfig;
use flowtune_models::ltx2::audio_vae::{pack_latents, unpack_latents};
use flowtune_models::ltx2::latents::{join, Geometry, Patches};
use flowtune_models::ltx2::transformer::{
    write_random_transformer, Ltx2Inputs, Ltx2Transformer, Ltx2TransformerConfig, AUDIO_EMBEDS,
    FPS, LTX2_TARGETS, VIDEO_SHAPE,
};
use flowtune_models::sd3::WeightInit;
use flowtune_models::{Denoiser, ExampleShape, TextConditioning, TrainableDenoiser};
use flowtune_sampling::SampleRng;
use tch::{Device, Kind, Tensor};

type Io = HashMap<String, Tensor>;

fn video_shape(entry: &serde_json::Value) -> [i64; 3] {
    let v: Vec<i64> = serde_json::from_value(entry["latent"].clone()).expect("latent");
    [v[0], v[1], v[2]]
}

fn lora_of(entry: &serde_json::Value) -> LoraConfig {
    let l = &entry["lora"];
    LoraConfig {
        rank: l["r"].as_i64().expect("r"),
        alpha: l["alpha"].as_f64().expect("alpha"),
        target_modules: serde_json::from_value(l["targets"].clone()).expect("targets"),
        ..Default::default()
    }
}

fn load(entry: &serde_json::Value, kind: Kind, lora: bool) -> Ltx2Transformer {
    let name = entry["name"].as_str().expect("name");
    let lora = lora.then(|| lora_of(entry));
    let mut model =
        Ltx2Transformer::load(&dir().join(name), Device::Cpu, kind, lora.as_ref()).expect("load");
    if lora.is_some() {
        model.load_lora(&dir().join(format!("{name}_lora.safetensors"))).expect("load lora");
    }
    model
}

/// diffusers' forward on the fixture's inputs: (video, audio) velocities.
fn forward(model: &Ltx2Transformer, io: &Io, entry: &serde_json::Value) -> (Tensor, Tensor) {
    let fps = Tensor::from(entry["fps"].as_f64().expect("fps"));
    model
        .forward(&Ltx2Inputs {
            video: &io["input.hidden_states"],
            audio: &io["input.audio_hidden_states"],
            video_text: &io["input.encoder_hidden_states"],
            audio_text: &io["input.audio_encoder_hidden_states"],
            text_mask: Some(&io["input.encoder_attention_mask"]),
            timestep: &io["input.timestep"],
            video_timestep: None,
            video_shape: video_shape(entry),
            fps: &fps,
        })
        .expect("forward")
}

/// Outputs without and with the LoRA, and every adapter gradient of
/// mean(sample_with_lora · loss_weight), against diffusers at 1e-4 relative.
fn check_entry(check: &mut Checker, entry: &serde_json::Value, checkpointing: bool) {
    let name = entry["name"].as_str().expect("name");
    let io = tensors(&format!("{name}_io.safetensors"));
    let model = load(entry, Kind::Float, true);
    model.set_gradient_checkpointing(checkpointing);
    model.set_adapters_enabled(false);
    let (video, audio) = tch::no_grad(|| forward(&model, &io, entry));
    check.close(&format!("{name} output.video"), &video, &io["output.video"]);
    check.close(&format!("{name} output.audio"), &audio, &io["output.audio"]);
    model.set_adapters_enabled(true);
    let (video, audio) = forward(&model, &io, entry);
    let out = Tensor::cat(&[video, audio], 1);
    check.close(&format!("{name} output.sample_with_lora"), &out, &io["output.sample_with_lora"]);
    (out * &io["loss_weight"]).mean(Kind::Float).backward();
    let vars = model.adapters().expect("adapters").store.variables();
    let adapted = entry["adapted_modules"].as_array().expect("adapted_modules").len();
    if vars.len() != 2 * adapted {
        check
            .fail(format!("{name}: {} adapter tensors, PEFT adapts {adapted} modules", vars.len()));
    }
    for (var_name, var) in &vars {
        match io.get(&format!("grad.transformer.{var_name}")) {
            Some(want) => check.close(&format!("{name} grad {var_name}"), &var.grad(), want),
            None => check.fail(format!("{name}: no reference gradient for {var_name}")),
        }
    }
    if model.store().variables().values().any(|v| v.requires_grad() || v.grad().defined()) {
        check.fail(format!("{name}: base weights must not train"));
    }
}

#[test]
fn transformers_match_diffusers() {
    let mut check = Checker::new("manifest.json ltx2_transformer");
    for entry in models_of_kind("ltx2_transformer") {
        check.case();
        check_entry(&mut check, &entry, false);
    }
    check.finish();
}

#[test]
fn gradient_checkpointing_keeps_the_gradients() {
    let mut check = Checker::new("manifest.json ltx2_transformer (gradient checkpointing)");
    for entry in models_of_kind("ltx2_transformer") {
        check.case();
        check_entry(&mut check, &entry, true);
    }
    check.finish();
}

/// The conditioning of a fixture as the family's denoiser takes it.
fn conditioning(io: &Io, entry: &serde_json::Value) -> TextConditioning {
    let b = io["input.timestep"].size()[0];
    let mut text = TextConditioning::new(io["input.encoder_hidden_states"].shallow_clone(), None);
    text.mask = Some(io["input.encoder_attention_mask"].shallow_clone());
    let shape = Tensor::from_slice(&video_shape(entry)).repeat([b, 1]);
    let fps = Tensor::full([b], entry["fps"].as_f64().expect("fps"), (Kind::Float, Device::Cpu));
    for (k, v) in [
        (AUDIO_EMBEDS, io["input.audio_encoder_hidden_states"].shallow_clone()),
        (VIDEO_SHAPE, shape),
        (FPS, fps),
    ] {
        text.extras.insert(k.into(), v);
    }
    text
}

/// The pipeline's packing, and the velocity of the joint latent (packed video tokens, then
/// audio tokens) is diffusers' two velocities concatenated.
#[test]
fn joint_latent_velocity_is_both_velocities() {
    let mut check = Checker::new("manifest.json ltx2_transformer (joint latent)");
    for entry in models_of_kind("ltx2_transformer") {
        check.case();
        let name = entry["name"].as_str().expect("name");
        let io = tensors(&format!("{name}_io.safetensors"));
        let model = load(&entry, Kind::Float, false);
        let c = &model.config;
        let (videos, audios) = (&io["input.video_latents"], &io["input.audio_latents"]);
        let patches = Patches { temporal: c.patch_size_t, spatial: c.patch_size };
        let video = patches.pack_video(videos);
        let audio = pack_latents(audios).unwrap();
        check.close(&format!("{name} packed video"), &video, &io["input.hidden_states"]);
        check.close(&format!("{name} packed audio"), &audio, &io["input.audio_hidden_states"]);
        let [frames, height, width] = video_shape(&entry);
        let fps = entry["fps"].as_f64().expect("fps");
        let g = Geometry { frames, height, width, audio_frames: audio.size()[1], fps };
        check.close(&format!("{name} unpacked video"), &patches.unpack_video(&video, &g), videos);
        check.close(&format!("{name} unpacked audio"), &unpack_latents(&audio, 4).unwrap(), audios);
        let latents = join(&video, &audio);
        let v = tch::no_grad(|| {
            model.velocity(&latents, &io["input.timestep"], &conditioning(&io, &entry))
        })
        .expect("velocity");
        check.close(&format!("{name} velocity"), &v, &io["output.sample"]);
    }
    check.finish();
}

#[test]
fn bf16_stays_close() {
    for entry in models_of_kind("ltx2_transformer") {
        let name = entry["name"].as_str().expect("name");
        let io = tensors(&format!("{name}_io.safetensors"));
        let model = load(&entry, Kind::BFloat16, false);
        let (video, audio) = tch::no_grad(|| forward(&model, &io, &entry));
        assert_eq!(video.kind(), Kind::BFloat16);
        let out = Tensor::cat(&[video, audio], 1).to_kind(Kind::Float);
        let want = &io["output.sample"];
        let err = (&out - want).norm().double_value(&[]) / want.norm().double_value(&[]);
        eprintln!("{name} bf16: relative error {err:.2e}");
        assert!(err < 3e-2, "{name} bf16 vs f32 reference: {err}");
    }
}

/// `name` in the folder `LTX2_TRANSFORMER_KEEP` names, where the tests leave what
/// `reference_ltx2_transformer.py --check-lora` and `--check-tiny` load into diffusers.
fn kept(name: &str) -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os("LTX2_TRANSFORMER_KEEP")?);
    std::fs::create_dir_all(&dir).expect("the keep folder");
    Some(dir.join(name))
}

/// A LoRA saved by flowtune loads back to the same forward (and, by
/// `reference_ltx2_transformer.py --check-lora`, into diffusers).
#[test]
fn saved_lora_reloads() {
    let name = "ltx2_transformer_v23_tiny";
    let entry = &models_of_kind("ltx2_transformer")
        .into_iter()
        .find(|e| e["name"] == name)
        .expect("the LTX-2.3 fixture");
    let io = tensors(&format!("{name}_io.safetensors"));
    let model = load(entry, Kind::Float, true);
    let d = scratch("ltx2-lora");
    let file = d.join("pytorch_lora_weights.safetensors");
    model.save_lora(&file).expect("save");
    if let Some(keep) = kept("lora.safetensors") {
        std::fs::copy(&file, keep).expect("keep the saved LoRA");
    }
    let lora = lora_of(entry);
    let mut again = Ltx2Transformer::load(&dir().join(name), Device::Cpu, Kind::Float, Some(&lora))
        .expect("load");
    again.load_lora(&file).expect("reload");
    let (a, b) = tch::no_grad(|| (forward(&model, &io, entry), forward(&again, &io, entry)));
    let diff =
        (a.0 - b.0).abs().max().double_value(&[]) + (a.1 - b.1).abs().max().double_value(&[]);
    assert_eq!(diff, 0.0);
}

#[test]
fn refused_configs_name_their_key() {
    let base: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir().join("ltx2_transformer_v23_tiny/config.json")).unwrap(),
    )
    .unwrap();
    let cases: [(&str, serde_json::Value, &[&str]); 6] = [
        ("use_prompt_adaln_single", false.into(), &["use_prompt_adaln_single"]),
        ("use_keyframes_abs_pos_embedding", true.into(), &["use_keyframes_abs_pos_embedding"]),
        ("audio_in_channels", 12.into(), &["in_channels", "audio_in_channels"]),
        ("audio_out_channels", 4.into(), &["out_channels", "audio_out_channels"]),
        ("audio_patch_size_t", 2.into(), &["audio_patch_size_t"]),
        ("rope_type", "complex".into(), &["rope_type"]),
    ];
    for (key, value, named) in cases {
        let mut config = base.clone();
        config[key] = value;
        let parsed: Ltx2TransformerConfig = serde_json::from_value(config).unwrap();
        let err = Ltx2Transformer::new(&parsed, Device::Cpu, Kind::Float, None)
            .err()
            .unwrap_or_else(|| panic!("{key} is refused"));
        for n in named {
            assert!(err.to_string().contains(n), "{key}: {err}");
        }
    }
    let stg: Ltx2TransformerConfig = serde_json::from_value(base).unwrap();
    assert!(stg.perturbed_attn, "the LTX-2.3 fixture runs the perturbed-attention processor");
}

/// The random writer's folder loads back with every weight, and the denoiser runs on made-up
/// inputs with LoRA on every LTX-2 target.
#[test]
fn random_tiny_transformer_loads_and_runs() {
    let d = scratch("ltx2-tiny");
    let config = Ltx2TransformerConfig::tiny();
    let mut rng = SampleRng::new(7);
    write_random_transformer(&d, &config, &mut rng, WeightInit::Normal(0.1), Kind::Float)
        .expect("write");
    if let Some(keep) = kept("tiny") {
        let mut rng = SampleRng::new(7);
        write_random_transformer(&keep, &config, &mut rng, WeightInit::Normal(0.1), Kind::Float)
            .expect("keep the tiny transformer");
    }
    let lora = LoraConfig {
        target_modules: LTX2_TARGETS.iter().map(|t| t.to_string()).collect(),
        ..Default::default()
    };
    let model = Ltx2Transformer::load(&d, Device::Cpu, Kind::Float, Some(&lora)).expect("load");
    let shape = ExampleShape { batch: 2, frames: 2, height: 2, width: 3, text_len: 5 };
    let inputs = model.example_inputs(shape);
    let v = tch::no_grad(|| model.velocity(&inputs.latents, &inputs.timestep, &inputs.text))
        .expect("velocity");
    assert_eq!(v.size(), inputs.latents.size());
    assert_eq!(inputs.tokens, 2 * (2 * 2 * 3 + 16));
    assert!(bool::try_from(v.isfinite().all()).unwrap());
    assert_eq!(model.adapters().unwrap().store.variables().len(), 2 * 28 * config.num_layers);
}

/// The released sizes (LTX-2.0, and with LTX-2.3's flags) with one block have diffusers'
/// parameter names and shapes (`ltx2_transformer_real_shapes.json`).
#[test]
fn released_layouts_match_diffusers_names_and_shapes() {
    let real = flowtune_fixtures::json("ltx2_transformer_real_shapes.json");
    for (name, entry) in real.as_object().expect("an object of layouts") {
        let want: BTreeMap<String, Vec<i64>> =
            serde_json::from_value(entry["shapes"].clone()).expect("shapes");
        let config: Ltx2TransformerConfig =
            serde_json::from_value(entry["config"].clone()).expect("config");
        let model = Ltx2Transformer::new(&config, Device::Cpu, Kind::Float, None).expect("build");
        let ours: BTreeMap<String, Vec<i64>> =
            model.weights.base.variables().into_iter().map(|(n, t)| (n, t.size())).collect();
        assert_eq!(ours, want, "{name}");
    }
}
