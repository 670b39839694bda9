//! Wan text-to-video trajectories end to end against `scripts/reference_wan_rollout.py`: the tiny
//! pipeline of `flowtune make-tiny wan` (Wan2.2-TI2V layout: 16× VAE with 2×2 pixel patches,
//! per-token timesteps) loaded through the registry, UMT5 prompt embeds padded to 512 tokens, CFG
//! against `""`, the UniPC flow-sigma grid with integer timesteps, an SDE window, given noise, and
//! the decoded frames side by side — for 1, 5 and 9 pixel frames at square and non-square sizes.

// The picture check `check_decoded` is not used: Wan decodes clips, compared frame by frame here.
#[allow(dead_code)]
mod common;

use flowtune_fixtures::{dir, tensors, Checker, MODEL_RTOL};
use flowtune_models::PipelineOptions;
use flowtune_rollout::{encode_rows, Engine, Guidance};
use flowtune_sampling::SamplerConfig;
use tch::{Device, Kind};

/// The script's `PROMPTS` and `SPEC`.
const PROMPTS: [&str; 2] = [
    "a red fox runs  through fresh snow",
    "a time-lapse of clouds over a mountain lake at dawn, with birds crossing the frame from \
     left to right",
];
const STEPS: usize = 6;
const GUIDANCE: f64 = 4.0;
const WINDOW: std::ops::Range<usize> = 1..4;

/// The script's `CASES` (pixel frames, height, width) and the latent shape each gives.
const CASES: [(usize, i64, i64, [i64; 4]); 3] =
    [(1, 32, 32, [16, 1, 2, 2]), (5, 32, 64, [16, 2, 2, 4]), (9, 64, 32, [16, 3, 4, 2])];

#[test]
fn wan_rollouts_match_diffusers_loop() {
    for (frames, height, width, latent) in CASES {
        let name = format!("wan_rollout_f{frames}_io.safetensors");
        let io = tensors(&name);
        let options =
            PipelineOptions { num_frames: Some(frames), ..PipelineOptions::new(Device::Cpu) };
        let pipe = flowtune_models::load_pipeline(&dir().join("wan_pipeline"), &options)
            .expect("load the tiny pipeline");
        let sampler = SamplerConfig {
            n: 1,
            steps: STEPS,
            guidance_scale: GUIDANCE,
            noise_level: 0.7,
            sde_window_size: WINDOW.len(),
            ..Default::default()
        };
        let latent_shape = pipe.latent_shape(height, width).expect("latent shape");
        assert_eq!(latent_shape, latent, "{name}");
        assert_eq!(pipe.decoded_frames(&latent_shape), frames);
        let engine = Engine::new(pipe.as_ref(), &sampler, latent_shape, 0).expect("engine");
        let mut check = Checker::new(&name);
        check.case();
        let text = encode_rows(pipe.as_ref(), &PROMPTS, &[]).expect("prompts");
        let negative = encode_rows(pipe.as_ref(), &[pipe.default_negative_prompt(); 2], &[])
            .expect("negative");
        for (key, cond) in [("prompt", &text), ("negative_prompt", &negative)] {
            let want = &io[&format!("output.{key}_embeds")];
            check.close_within(&format!("{key}_embeds"), &cond.embeds, want, MODEL_RTOL);
        }
        let guidance = Guidance { scale: GUIDANCE, scale_2: None, negative: Some(&negative) };
        let windows = vec![WINDOW; 2];
        let out = common::check_trajectory(&mut check, &io, &engine, &text, guidance, &windows);
        let pixels = tch::no_grad(|| pipe.decode_rgb8(&out.final_latents)).expect("decode");
        let video = &io["output.video"];
        let (b, c, t, h, w) = video.size5().expect("(B, 3, T, H, W)");
        assert_eq!((t, h, w), (frames as i64, height, width), "{name}");
        let want = ((video.clamp(-1.0, 1.0) + 1.0) * 127.5).round().permute([0, 3, 2, 4, 1]);
        let want = want.reshape([b, h, t * w, c]).to_kind(Kind::Int);
        assert_eq!(pixels.size(), want.size(), "{name}: frames side by side");
        let off = (pixels.to_kind(Kind::Int) - want).abs().max().int64_value(&[]);
        if off > 1 {
            check.fail(format!("decoded frames differ from diffusers' by {off} levels"));
        }
        check.finish();
    }
}

#[test]
fn frame_counts_and_sides_are_checked_by_key() {
    let path = dir().join("wan_pipeline");
    let options = PipelineOptions { num_frames: Some(6), ..PipelineOptions::new(Device::Cpu) };
    let err = flowtune_models::load_pipeline(&path, &options).err().expect("6 frames").to_string();
    assert!(err.contains("num_frames 6 (model.num_frames / --num-frames)"), "{err}");
    assert!(err.contains("4k + 1 frames (1, 5, 9, …, 81)"), "{err}");
    let pipe = flowtune_models::load_pipeline(&path, &PipelineOptions::new(Device::Cpu))
        .expect("default frames");
    assert_eq!(pipe.latent_shape(32, 32).expect("81 frames"), [16, 21, 2, 2]);
    let err = pipe.latent_shape(48, 32).unwrap_err().to_string();
    assert!(err.contains("48 pixels (model.resolution / --resolution)"), "{err}");
    assert!(err.contains("multiples of 32 (VAE factor 16 × patch size)"), "{err}");
    let options = PipelineOptions { num_frames: Some(5), ..PipelineOptions::new(Device::Cpu) };
    let pipe = flowtune_models::load_pipeline(&path, &options).expect("5 frames");
    let latents = tch::Tensor::randn([1, 16, 2, 2, 2], (Kind::Float, Device::Cpu));
    let strip = tch::no_grad(|| pipe.decode_rgb8(&latents)).expect("decode");
    assert_eq!(strip.size(), [1, 32, 5 * 32, 3], "5 frames side by side");
    let encoded = tch::no_grad(|| pipe.encode_rgb8(&strip)).expect("encode the strip as a clip");
    assert_eq!(encoded.size(), [1, 16, 2, 2, 2]);
    let err = pipe.encode_rgb8(&strip.narrow(2, 0, 96)).unwrap_err().to_string();
    assert!(err.contains("96 pixels wide do not hold 5 frames side by side"), "{err}");
    let err = flowtune_models::load_pipeline(&dir().join("z_image_pipeline"), &options)
        .err()
        .expect("a picture family")
        .to_string();
    assert!(err.contains("num_frames 5 (model.num_frames / --num-frames) is for video"), "{err}");
}
