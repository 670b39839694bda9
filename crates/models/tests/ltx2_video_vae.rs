//! LTX-2's video VAE against diffusers' `AutoencoderKLLTX2Video`
//! (`scripts/reference_ltx2_video_vae.py`): encode and decode of 1 and 9 frames for a tiny
//! copy of the released layout and a timestep-conditioned one, the pipeline's latent
//! normalisation, the released parameter names and shapes, `make-tiny`'s writer, and what is
//! refused.

use std::collections::BTreeMap;

use flowtune_fixtures::{dir, json, models_of_kind, scratch, tensors, Checker};
use flowtune_models::ltx2::video_vae::{AutoencoderKlLtx2Video, Flags, Ltx2VideoVaeConfig};
use tch::{Device, Kind, Tensor};

/// The acceptance bound of this port: ‖ours − diffusers‖ / ‖diffusers‖.
const RTOL: f64 = 1e-5;

fn load(name: &str) -> AutoencoderKlLtx2Video {
    AutoencoderKlLtx2Video::load(&dir().join(name), Device::Cpu, Kind::Float).expect("load")
}

/// Each `ltx2_video_vae` fixture, per frame count: posterior mean and log-variance, the mean
/// normalised as the pipeline does, the given latents denormalised and decoded (with the
/// fixture's timestep when the config is conditioned).
#[test]
fn ltx2_video_vaes_match_diffusers() {
    let mut check = Checker::new("manifest.json ltx2_video_vae");
    for entry in models_of_kind("ltx2_video_vae") {
        check.case();
        let name = entry["name"].as_str().expect("name");
        let vae = load(entry["model"].as_str().expect("model"));
        for (key, ours) in [
            ("spatial_compression_ratio", vae.spatial_compression_ratio()),
            ("temporal_compression_ratio", vae.temporal_compression_ratio()),
        ] {
            if entry[key].as_i64() != Some(ours) {
                check.fail(format!("{name}: {key} {ours}, diffusers {}", entry[key]));
            }
        }
        let io = tensors(&format!("{name}_io.safetensors"));
        let timestep = io.get("input.timestep");
        let keep: Vec<i64> =
            serde_json::from_value(entry["output_frames"].clone()).expect("frames");
        for t in entry["frames"].as_array().expect("frames") {
            let key = |k: &str| format!("t{t}.{k}");
            let what = |k: &str| format!("{name} {}", key(k));
            let video = io[&key("input.video")].to_kind(Kind::Float);
            let (mean, logvar) = tch::no_grad(|| vae.encode(&video)).expect("encode");
            check.close_within(&what("output.mean"), &mean, &io[&key("output.mean")], RTOL);
            check.close_within(&what("output.logvar"), &logvar, &io[&key("output.logvar")], RTOL);
            let normalized = vae.normalize_latents(&mean).expect("normalize");
            let want = &io[&key("output.normalized")];
            check.close_within(&what("output.normalized"), &normalized, want, RTOL);
            let latents = &io[&key("input.latents")];
            let denormalized = vae.denormalize_latents(latents).expect("denormalize");
            let want = &io[&key("output.denormalized")];
            check.close_within(&what("output.denormalized"), &denormalized, want, RTOL);
            let decoded = tch::no_grad(|| vae.decode(latents, timestep)).expect("decode");
            let frames = decoded.size()[2];
            let kept: Vec<i64> = keep.iter().copied().filter(|&f| f < frames).collect();
            let decoded = decoded.index_select(2, &Tensor::from_slice(&kept));
            check.close_within(&what("output.video"), &decoded, &io[&key("output.video")], RTOL);
        }
    }
    check.finish();
}

/// The released configs (`examples/models/{ltx-2,ltx-2.3}/vae`) build exactly diffusers' tensors
/// (names and shapes, buffers included) at 32× space and 8× time; [`Ltx2VideoVaeConfig::ltx2`]
/// is LTX-2.0's.
#[test]
fn the_released_layouts_have_diffusers_names_and_shapes() {
    let real = json("ltx2_video_vae_shapes.json");
    for (name, entry) in real.as_object().expect("an object of layouts") {
        let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/models");
        let path = format!("{examples}/{name}/vae/config.json");
        let config: Ltx2VideoVaeConfig =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("config")).expect("parse");
        let diffusers: Ltx2VideoVaeConfig =
            serde_json::from_value(entry["config"].clone()).expect("config");
        assert_eq!(config, diffusers, "{name}");
        if name == "ltx-2" {
            assert_eq!(config, Ltx2VideoVaeConfig::ltx2());
        }
        let want: BTreeMap<String, Vec<i64>> =
            serde_json::from_value(entry["shapes"].clone()).expect("shapes");
        let vae = AutoencoderKlLtx2Video::new(&config, Device::Cpu, Kind::Float).expect("build");
        let ours: BTreeMap<String, Vec<i64>> =
            vae.store.variables().into_iter().map(|(n, t)| (n, t.size())).collect();
        assert_eq!(ours, want, "{name}");
        let ratios = (vae.spatial_compression_ratio(), vae.temporal_compression_ratio());
        assert_eq!(ratios, (32, 8), "{name}");
    }
}

/// `tiny()` is the fixture's config; `write_random` writes a VAE that loads back, with
/// statistics that normalise and denormalise to the identity, and runs 9 frames through.
#[test]
fn the_tiny_writer_round_trips() {
    let fixture: Ltx2VideoVaeConfig = serde_json::from_str(
        &std::fs::read_to_string(dir().join("ltx2_video_vae_tiny/config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(fixture, Ltx2VideoVaeConfig::tiny());
    let out = scratch("ltx2-video-vae");
    AutoencoderKlLtx2Video::write_random(&out, 3, &Ltx2VideoVaeConfig::tiny()).expect("write");
    let vae = AutoencoderKlLtx2Video::load(&out, Device::Cpu, Kind::Float).expect("load");
    let std = vae.latents_std();
    assert!(std.min().double_value(&[]) >= 0.5, "latents_std {std}");
    let video = Tensor::rand([1, 3, 9, 64, 64], (Kind::Float, Device::Cpu)) * 2.0 - 1.0;
    let (mean, logvar) = tch::no_grad(|| vae.encode(&video)).expect("encode");
    assert_eq!(mean.size(), [1, 4, 2, 2, 2]);
    assert_eq!(logvar.size(), mean.size());
    let z = vae.normalize_latents(&mean).unwrap();
    let back = vae.denormalize_latents(&z).unwrap();
    assert!(f64::try_from((back - &mean).abs().max()).unwrap() < 1e-5);
    let decoded = tch::no_grad(|| vae.decode(&z, None)).expect("decode");
    assert_eq!(decoded.size(), [1, 3, 9, 64, 64]);
    assert!(bool::try_from(decoded.isfinite().all()).unwrap());
}

fn refusal(config: Ltx2VideoVaeConfig) -> String {
    AutoencoderKlLtx2Video::new(&config, Device::Cpu, Kind::Float)
        .err()
        .expect("refused")
        .to_string()
}

/// Settings diffusers would run randomly, reject or build wrongly are refused by key.
#[test]
fn unsupported_configs_are_refused_by_key() {
    let tiny = Ltx2VideoVaeConfig::tiny;
    let cases = [
        (
            Ltx2VideoVaeConfig { decoder_inject_noise: Flags::All(true), ..tiny() },
            "decoder_inject_noise",
        ),
        (Ltx2VideoVaeConfig { patch_size_t: 2, ..tiny() }, "patch_size_t"),
        (
            Ltx2VideoVaeConfig { spatial_compression_ratio: Some(64), ..tiny() },
            "spatial_compression_ratio",
        ),
        (Ltx2VideoVaeConfig { upsample_residual: Flags::All(true), ..tiny() }, "upsample_residual"),
        (
            Ltx2VideoVaeConfig {
                downsample_type: ["spatial", "temporal", "sideways", "spatiotemporal"]
                    .map(String::from)
                    .to_vec(),
                ..tiny()
            },
            "downsample_type",
        ),
        (Ltx2VideoVaeConfig { layers_per_block: vec![1; 4], ..tiny() }, "layers_per_block"),
        (
            Ltx2VideoVaeConfig { decoder_spatial_padding_mode: "mirror".into(), ..tiny() },
            "decoder_spatial_padding_mode",
        ),
        (
            Ltx2VideoVaeConfig { upsample_type: vec!["spatial".into(); 3], ..tiny() },
            "upsample_type",
        ),
        (
            Ltx2VideoVaeConfig {
                timestep_conditioning: true,
                decoder_block_out_channels: vec![4, 8, 8],
                upsample_factor: vec![1, 1, 2],
                upsample_residual: Flags::All(false),
                ..tiny()
            },
            "timestep_conditioning",
        ),
    ];
    for (config, key) in cases {
        let err = refusal(config);
        assert!(err.contains(key), "{key}: {err}");
    }
    let path = scratch("ltx2-video-vae-refused");
    let mut config = serde_json::to_value(Ltx2VideoVaeConfig::tiny()).unwrap();
    config["decoder_inject_noise"] = serde_json::json!(true);
    std::fs::write(path.join("config.json"), config.to_string()).unwrap();
    let err = AutoencoderKlLtx2Video::load(&path, Device::Cpu, Kind::Float).err().expect("refused");
    assert!(err.to_string().contains("decoder_inject_noise"), "{err}");
}

/// Inputs of the wrong shape, and a timestep given or missing against the config, are explained.
#[test]
fn wrong_inputs_are_explained() {
    let plain = load("ltx2_video_vae_tiny");
    let cond = load("ltx2_video_vae_cond");
    let f = (Kind::Float, Device::Cpu);
    let err = |r: Result<Tensor, flowtune_models::ModelError>| r.expect_err("refused").to_string();
    let e = plain.encode(&Tensor::zeros([1, 3, 8, 32, 32], f)).expect_err("refused").to_string();
    assert!(e.contains("[1, 3, 8, 32, 32]") && e.contains("1 + 8k"), "{e}");
    let e = plain.encode(&Tensor::zeros([1, 3, 9, 32, 48], f)).expect_err("refused").to_string();
    assert!(e.contains("multiples of 32"), "{e}");
    let e = plain.encode(&Tensor::zeros([3, 9, 32, 32], f)).expect_err("refused").to_string();
    assert!(e.contains("expected [B, 3,"), "{e}");
    let e = err(plain.decode(&Tensor::zeros([1, 5, 2, 2, 2], f), None));
    assert!(e.contains("expected [B, 4, F, h, w]"), "{e}");
    let e = err(plain.decode(&Tensor::zeros([1, 4, 2, 1, 2], f), None));
    assert!(e.contains("decoder_spatial_padding_mode"), "{e}");
    let e = err(plain.decode(&Tensor::zeros([1, 4, 2, 2, 2], f), Some(&Tensor::from(0.05))));
    assert!(e.contains("no timestep_conditioning"), "{e}");
    let e = err(cond.decode(&Tensor::zeros([2, 4, 2, 2, 2], f), None));
    assert!(e.contains("needs a timestep"), "{e}");
    let e = err(cond.decode(&Tensor::zeros([2, 4, 2, 2, 2], f), Some(&Tensor::zeros([3], f))));
    assert!(e.contains("[3]"), "{e}");
    let e = err(plain.normalize_latents(&Tensor::zeros([1, 3, 2, 2, 2], f)));
    assert!(e.contains("expected [B, 4, F, h, w]"), "{e}");
    // One timestep for the whole batch is the per-sample one repeated.
    let z = Tensor::randn([2, 4, 1, 2, 2], f);
    let one = tch::no_grad(|| cond.decode(&z, Some(&Tensor::from(0.3f32)))).unwrap();
    let each = tch::no_grad(|| cond.decode(&z, Some(&Tensor::from_slice(&[0.3f32, 0.3])))).unwrap();
    assert!(f64::try_from((one - each).abs().max()).unwrap() < 1e-6);
}

/// bf16 weights run the conditioned VAE (9 frames both ways) and stay near diffusers' f32.
#[test]
fn bf16_stays_close() {
    let name = "ltx2_video_vae_cond";
    let vae =
        AutoencoderKlLtx2Video::load(&dir().join(name), Device::Cpu, Kind::BFloat16).expect("load");
    let io = tensors(&format!("{name}_io.safetensors"));
    let rel = |out: &Tensor, want: &Tensor| {
        let out = out.to_kind(Kind::Double);
        let want = want.to_kind(Kind::Double);
        f64::try_from((&out - &want).norm()).unwrap() / f64::try_from(want.norm()).unwrap()
    };
    let (mean, _) = tch::no_grad(|| vae.encode(&io["t9.input.video"])).expect("encode");
    assert_eq!(mean.kind(), Kind::BFloat16);
    let err = rel(&mean, &io["t9.output.mean"]);
    println!("bf16 mean: relative error {err:.2e}");
    assert!(err < 3e-2, "bf16 mean: relative error {err:.2e}");
    let decoded = tch::no_grad(|| {
        vae.decode(&io["t9.input.latents"], Some(&io["input.timestep"].to_kind(Kind::BFloat16)))
    })
    .expect("decode");
    let decoded = decoded.index_select(2, &Tensor::from_slice(&[0i64, 4, 8]));
    let err = rel(&decoded, &io["t9.output.video"]);
    println!("bf16 video: relative error {err:.2e}");
    assert!(err < 3e-2, "bf16 video: relative error {err:.2e}");
}
