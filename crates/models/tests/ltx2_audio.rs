//! LTX-2 audio parity with diffusers over the `ltx2_audio_vae` and `ltx2_vocoder` fixtures of
//! `manifest.json` (`scripts/reference_ltx2_audio.py`): the audio VAE's posterior of a random
//! spectrogram, its decode of given latents and LTX2Pipeline's unpack → denormalise → decode of
//! packed tokens; the plain, Snake and bandwidth-extending vocoders' waveforms; the Kaiser filters
//! computed here against diffusers'; refused configs and wrong-shape inputs; the tiny writers.

use flowtune_fixtures::{dir, models_of_kind, scratch, tensors, Checker};
use flowtune_models::ltx2::audio_vae::{
    pack_latents, unpack_latents, AutoencoderKlLtx2Audio, Ltx2AudioVaeConfig,
};
use flowtune_models::ltx2::vocoder::{
    Ltx2Vocoder, Ltx2VocoderBweConfig, Ltx2VocoderClass, Ltx2VocoderConfig,
};
use tch::{Device, Kind, Tensor};

/// The acceptance bound of both VAE directions and the waveforms.
const RTOL: f64 = 1e-5;
/// The bound of bf16 runs against diffusers' bf16 runs.
const BF16_RTOL: f64 = 1e-3;

/// Encode, decode and the pipeline's token decode, each with its own worst error.
#[test]
fn audio_vaes_match_diffusers() {
    let mut encode = Checker::new("ltx2_audio_vae encode");
    let mut decode = Checker::new("ltx2_audio_vae decode");
    let mut pipeline = Checker::new("ltx2_audio_vae unpack → denormalize → decode");
    for entry in models_of_kind("ltx2_audio_vae") {
        let name = entry["name"].as_str().expect("name");
        let model_dir = dir().join(entry["model"].as_str().expect("model"));
        let vae = AutoencoderKlLtx2Audio::load(&model_dir, Device::Cpu, Kind::Float).expect("load");
        let io = tensors(&format!("{name}_io.safetensors"));
        encode.case();
        let (mean, logvar) = tch::no_grad(|| vae.encode(&io["input.mel"])).expect("encode");
        encode.close_within(&format!("{name} mean"), &mean, &io["output.mean"], RTOL);
        encode.close_within(&format!("{name} logvar"), &logvar, &io["output.logvar"], RTOL);
        let tokens = tch::no_grad(|| vae.encode_tokens(&io["input.mel"])).expect("encode tokens");
        let want = vae.normalize_latents(&pack_latents(&io["output.mean"]).unwrap()).unwrap();
        encode.close_within(&format!("{name} encode_tokens"), &tokens, &want, RTOL);
        decode.case();
        let decoded = tch::no_grad(|| vae.decode(&io["input.latents"])).expect("decode");
        let want = &io["output.decoded"];
        if decoded.size() != want.size() {
            decode.fail(format!("{name}: decoded {:?}, want {:?}", decoded.size(), want.size()));
        }
        decode.close_within(&format!("{name} decoded"), &decoded, want, RTOL);
        let frames = io["input.latents"].size()[2];
        assert_eq!(decoded.size()[2], vae.mel_frames(frames), "{name}: mel_frames");
        pipeline.case();
        let tokens = &io["input.tokens"];
        let from_tokens = tch::no_grad(|| vae.decode_tokens(tokens)).expect("decode tokens");
        let want = &io["output.tokens_decoded"];
        pipeline.close_within(&format!("{name} tokens_decoded"), &from_tokens, want, RTOL);
        // The helpers invert each other.
        let m = vae.config.latent_mel_bins();
        let latents = unpack_latents(&vae.denormalize_latents(tokens).unwrap(), m).unwrap();
        let back = vae.normalize_latents(&pack_latents(&latents).unwrap()).unwrap();
        pipeline.close_within(&format!("{name} pack/normalise round trip"), &back, tokens, 1e-6);
    }
    encode.finish();
    decode.finish();
    pipeline.finish();
}

#[test]
fn vocoders_match_diffusers() {
    let mut check = Checker::new("manifest.json ltx2_vocoder");
    for entry in models_of_kind("ltx2_vocoder") {
        check.case();
        let name = entry["name"].as_str().expect("name");
        let model_dir = dir().join(entry["model"].as_str().expect("model"));
        let vocoder = Ltx2Vocoder::load(&model_dir, Device::Cpu, Kind::Float).expect("load");
        assert_eq!(vocoder.config.class_name(), entry["class"].as_str().unwrap(), "{name}");
        assert_eq!(Some(vocoder.output_sampling_rate()), entry["sample_rate"].as_i64(), "{name}");
        let io = tensors(&format!("{name}_io.safetensors"));
        let mel = &io["input.mel"];
        let waveform = tch::no_grad(|| vocoder.forward(mel)).expect("forward");
        let want = &io["output.waveform"];
        if waveform.size() != want.size() {
            check.fail(format!("{name}: waveform {:?}, want {:?}", waveform.size(), want.size()));
        }
        assert_eq!(vocoder.config.samples(mel.size()[2]), want.size()[2], "{name}: samples");
        check.close_within(&format!("{name} waveform"), &waveform, want, RTOL);
    }
    check.finish();
}

/// The Kaiser filters `write_random` computes equal the ones diffusers stored, for even and odd
/// kernels; the tiny writers' folders load back.
#[test]
fn written_vocoders_hold_diffusers_filters() {
    let tmp = scratch("ltx2_vocoder_filters");
    for name in ["ltx2_vocoder_snake", "ltx2_vocoder_bwe_tiny"] {
        let stored = Ltx2Vocoder::load(&dir().join(name), Device::Cpu, Kind::Float).expect("load");
        let out = tmp.join(name);
        Ltx2Vocoder::write_random(&out, 5, &stored.config).expect("write");
        let written = Ltx2Vocoder::load(&out, Device::Cpu, Kind::Float).expect("reload");
        let (a, b) = (stored.store.variables(), written.store.variables());
        let filters: Vec<&String> = a.keys().filter(|n| n.ends_with(".filter")).collect();
        assert!(!filters.is_empty(), "{name}: no filters");
        for n in filters {
            let diff = (&a[n] - &b[n]).abs().max().double_value(&[]);
            assert!(diff < 1e-7, "{name} {n}: computed filter differs by {diff}");
        }
    }
}

/// The folders stay in cargo's `target/tmp/ltx2_audio-tiny` for
/// `scripts/reference_ltx2_audio.py --check` (diffusers loads them).
#[test]
fn tiny_writers_load_and_run() {
    let tmp = flowtune_fixtures::shared!("tiny");
    let vae_dir = tmp.join("audio_vae");
    let config = Ltx2AudioVaeConfig::tiny();
    AutoencoderKlLtx2Audio::write_random(&vae_dir, 3, &config).expect("write vae");
    let vae = AutoencoderKlLtx2Audio::load(&vae_dir, Device::Cpu, Kind::Float).expect("vae");
    assert_eq!(
        vae.config,
        Ltx2AudioVaeConfig { class_name: vae.config.class_name.clone(), ..config }
    );
    let (frames, m) = (3, vae.config.latent_mel_bins());
    let tokens = Tensor::randn([1, frames, vae.config.base_channels], (Kind::Float, Device::Cpu));
    let mel = tch::no_grad(|| vae.decode_tokens(&tokens)).expect("decode");
    assert_eq!(mel.size(), [1, 2, vae.mel_frames(frames), 4 * m]);
    assert!((vae.latents_per_second() - 25.0).abs() < 1e-12);
    assert_eq!(
        (vae.latent_frames(5.0), vae.latent_frames(0.1), vae.latent_frames(0.02)),
        (125, 2, 0)
    );
    for (i, class) in [
        Ltx2VocoderClass::Plain(Ltx2VocoderConfig::tiny()),
        Ltx2VocoderClass::WithBwe(Box::new(Ltx2VocoderBweConfig::tiny())),
    ]
    .into_iter()
    .enumerate()
    {
        let path = tmp.join(format!("vocoder{i}"));
        Ltx2Vocoder::write_random(&path, 4, &class).expect("write vocoder");
        let vocoder = Ltx2Vocoder::load(&path, Device::Cpu, Kind::Float).expect("vocoder");
        assert_eq!(vocoder.config, class);
        let wave = tch::no_grad(|| vocoder.forward(&mel)).expect("forward");
        let samples = vocoder.config.samples(mel.size()[2]);
        assert_eq!(wave.size(), [1, 2, samples]);
        assert!(wave.isfinite().all().int64_value(&[]) == 1);
    }
}

/// The released layouts (diffusers' defaults) are accepted, and give 100 spectrogram frames per
/// second of 24 kHz (LTX-2) or 48 kHz (LTX-2.3) sound.
#[test]
fn released_layouts_are_accepted() {
    Ltx2AudioVaeConfig::default().validate().expect("audio VAE defaults");
    let plain = Ltx2VocoderClass::Plain(Ltx2VocoderConfig::default());
    let bwe = Ltx2VocoderClass::WithBwe(Box::default());
    for (class, rate) in [(plain, 24000), (bwe, 48000)] {
        class.validate().expect("vocoder defaults");
        assert_eq!(class.output_sampling_rate(), rate);
        assert_eq!(class.samples(100), rate, "{}", class.class_name());
    }
}

#[test]
fn refused_configs_name_their_key() {
    let refused = |config: Ltx2AudioVaeConfig, key: &str| {
        let err = AutoencoderKlLtx2Audio::new(&config, Device::Cpu, Kind::Float).err();
        let err = err.unwrap_or_else(|| panic!("{key}: accepted")).to_string();
        assert!(err.contains(key), "{key}: {err}");
    };
    let tiny = Ltx2AudioVaeConfig::tiny();
    refused(Ltx2AudioVaeConfig { causality_axis: "time".into(), ..tiny.clone() }, "causality_axis");
    refused(Ltx2AudioVaeConfig { norm_type: "group".into(), ..tiny.clone() }, "norm_type");
    refused(Ltx2AudioVaeConfig { norm_type: "layer".into(), ..tiny.clone() }, "norm_type");
    refused(Ltx2AudioVaeConfig { ch_mult: vec![1, 2], ..tiny.clone() }, "ch_mult");
    refused(Ltx2AudioVaeConfig { mel_bins: None, ..tiny.clone() }, "mel_bins");
    refused(Ltx2AudioVaeConfig { double_z: false, ..tiny.clone() }, "double_z");
    refused(Ltx2AudioVaeConfig { latent_channels: 0, ..tiny }, "latent_channels");
    let grouped = Ltx2AudioVaeConfig {
        norm_type: "group".into(),
        causality_axis: "none".into(),
        ..Ltx2AudioVaeConfig::tiny()
    };
    refused(grouped, "base_channels");

    let refused = |config: Ltx2VocoderClass, key: &str| {
        let err = Ltx2Vocoder::new(&config, Device::Cpu, Kind::Float).err();
        let err = err.unwrap_or_else(|| panic!("{key}: accepted")).to_string();
        assert!(err.contains(key), "{key}: {err}");
    };
    let plain = Ltx2VocoderConfig::tiny();
    let bwe = Ltx2VocoderBweConfig::tiny();
    let p = |c: Ltx2VocoderConfig| Ltx2VocoderClass::Plain(c);
    let b = |c: Ltx2VocoderBweConfig| Ltx2VocoderClass::WithBwe(Box::new(c));
    refused(
        p(Ltx2VocoderConfig { upsample_factors: vec![4], ..plain.clone() }),
        "upsample_factors",
    );
    refused(p(Ltx2VocoderConfig { resnet_dilations: vec![], ..plain.clone() }), "resnet_dilations");
    refused(p(Ltx2VocoderConfig { act_fn: "gelu".into(), ..plain.clone() }), "act_fn");
    refused(p(Ltx2VocoderConfig { antialias: true, ..plain.clone() }), "antialias");
    refused(
        p(Ltx2VocoderConfig { final_act_fn: Some("relu".into()), ..plain.clone() }),
        "final_act_fn",
    );
    refused(p(Ltx2VocoderConfig { hidden_channels: 30, ..plain }), "hidden_channels");
    refused(b(Ltx2VocoderBweConfig { bwe_act_fn: "gelu".into(), ..bwe.clone() }), "bwe_act_fn");
    refused(b(Ltx2VocoderBweConfig { bwe_in_channels: 12, ..bwe.clone() }), "bwe_in_channels");
    refused(b(Ltx2VocoderBweConfig { hop_length: 8, ..bwe.clone() }), "bwe_upsample_factors");
    refused(b(Ltx2VocoderBweConfig { window_length: 24, ..bwe.clone() }), "window_length");
    refused(b(Ltx2VocoderBweConfig { output_sampling_rate: 44100, ..bwe }), "output_sampling_rate");

    // The folder's class decides the config; an unknown one or none is named.
    for (text, key) in
        [(r#"{"_class_name": "HifiGan"}"#, "HifiGan"), (r#"{"in_channels": 32}"#, "_class_name")]
    {
        let err = serde_json::from_str::<Ltx2VocoderClass>(text).unwrap_err().to_string();
        assert!(err.contains(key), "{err}");
    }
    let config: Ltx2VocoderClass = serde_json::from_str(
        r#"{"_class_name": "LTX2VocoderWithBWE", "_diffusers_version": "0.42.1"}"#,
    )
    .unwrap();
    assert_eq!(config, Ltx2VocoderClass::WithBwe(Box::default()));
    assert_eq!(config.output_sampling_rate(), 48000);
}

#[test]
fn wrong_shapes_are_explained() {
    let vae =
        AutoencoderKlLtx2Audio::load(&dir().join("ltx2_audio_vae_tiny"), Device::Cpu, Kind::Float)
            .expect("load");
    let t = |shape: &[i64]| Tensor::zeros(shape, (Kind::Float, Device::Cpu));
    let expect = |result: Result<Tensor, flowtune_models::ModelError>, what: &str| {
        let err = result.err().unwrap_or_else(|| panic!("{what}: accepted")).to_string();
        assert!(err.contains(what), "{what}: {err}");
    };
    expect(vae.encode(&t(&[1, 3, 8, 16])).map(|(m, _)| m), "expected [B, 2, frames");
    expect(vae.encode(&t(&[2, 8, 16])).map(|(m, _)| m), "expected [B, 2, frames");
    expect(vae.decode(&t(&[1, 4, 3, 4])), "expected [B, 2, frames");
    expect(vae.decode_tokens(&t(&[1, 3, 12])), "[B, L, 8]");
    expect(unpack_latents(&t(&[1, 3, 10]), 4), "[B, L, C·4]");
    expect(pack_latents(&t(&[1, 3, 10])), "[B, C, L, M]");
    let vocoder = Ltx2Vocoder::load(&dir().join("ltx2_vocoder_tiny"), Device::Cpu, Kind::Float)
        .expect("load");
    expect(vocoder.forward(&t(&[1, 2, 5, 12])), "in_channels 32");
    expect(vocoder.forward(&t(&[2, 5, 16])), "in_channels 32");
}

/// bf16 weights (the released checkpoints' dtype) give diffusers' bf16 results.
#[test]
fn bf16_matches_diffusers_bf16() {
    let bf16 = Kind::BFloat16;
    let mut check = Checker::new("ltx2 audio bf16");
    for entry in models_of_kind("ltx2_audio_vae") {
        check.case();
        let name = entry["name"].as_str().expect("name");
        let io = tensors(&format!("{name}_io.safetensors"));
        let vae = AutoencoderKlLtx2Audio::load(&dir().join(name), Device::Cpu, bf16).expect("load");
        let tokens = io["input.tokens"].to_kind(bf16);
        let mel = tch::no_grad(|| vae.decode_tokens(&tokens)).expect("decode");
        assert_eq!(mel.kind(), bf16);
        let want = &io["output.tokens_decoded_bf16"];
        check.close_within(&format!("{name} tokens_decoded bf16"), &mel, want, BF16_RTOL);
    }
    for entry in models_of_kind("ltx2_vocoder") {
        check.case();
        let name = entry["name"].as_str().expect("name");
        let io = tensors(&format!("{name}_io.safetensors"));
        let vocoder = Ltx2Vocoder::load(&dir().join(name), Device::Cpu, bf16).expect("load");
        let wave =
            tch::no_grad(|| vocoder.forward(&io["input.mel"].to_kind(bf16))).expect("forward");
        let want = &io["output.waveform_bf16"];
        check.close_within(&format!("{name} waveform bf16"), &wave, want, BF16_RTOL);
    }
    check.finish();
}

/// `--random-weights`: the buffers keep their meaning (Kaiser filters as diffusers computes them,
/// identity latent statistics) while the weights are drawn.
#[test]
fn random_weights_keep_buffers() {
    let name = "ltx2_vocoder_bwe_tiny";
    let stored = Ltx2Vocoder::load(&dir().join(name), Device::Cpu, Kind::Float).expect("load");
    let random = flowtune_models::with_random_weights(9, || {
        Ltx2Vocoder::load(&dir().join(name), Device::Cpu, Kind::Float)
    })
    .expect("random load");
    let (a, b) = (stored.store.variables(), random.store.variables());
    for (n, value) in &a {
        let diff = (value - &b[n]).abs().max().double_value(&[]);
        if n.ends_with(".filter") {
            assert!(diff < 1e-7, "{n}: random filter differs by {diff}");
        } else if n.ends_with(".weight") {
            assert!(diff > 0.0, "{n}: not drawn");
        }
    }
    let vae = flowtune_models::with_random_weights(9, || {
        AutoencoderKlLtx2Audio::load(&dir().join("ltx2_audio_vae_tiny"), Device::Cpu, Kind::Float)
    })
    .expect("random vae");
    let (mean, std) = (vae.latents_mean(), vae.latents_std());
    assert_eq!(mean.abs().max().double_value(&[]), 0.0);
    assert_eq!((std - 1.0).abs().max().double_value(&[]), 0.0);
}
