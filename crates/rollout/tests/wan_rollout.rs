//! Wan text-to-video trajectories end to end against `scripts/reference_wan_rollout.py`: the tiny
//! pipeline of `flowtune make-tiny wan` (Wan2.2-TI2V layout: 16× VAE with 2×2 pixel patches,
//! per-token timesteps) loaded through the registry, UMT5 prompt embeds padded to 512 tokens, CFG
//! against `""`, the UniPC flow-sigma grid with integer timesteps, an SDE window, given noise, and
//! the decoded frames side by side — for 1, 5 and 9 pixel frames at square and non-square sizes;
//! and the two-expert layout of `make-tiny wan --a14b` (Wan2.2-T2V-A14B) with `guidance_scale_2`.

// The picture check `check_decoded` is not used: Wan decodes clips, compared frame by frame here.
#[allow(dead_code)]
mod common;

use flowtune_fixtures::{dir, tensors, Checker, MODEL_RTOL};
use flowtune_models::{guided_velocity, PipelineOptions};
use flowtune_rollout::{encode_rows, Engine, Guidance, Rows};
use flowtune_sampling::SamplerConfig;
use tch::{Device, Kind, Tensor};

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
        let sampler = spec_sampler();
        let latent_shape = pipe.latent_shape(height, width).expect("latent shape");
        assert_eq!(latent_shape, latent, "{name}");
        assert_eq!(pipe.decoded_frames(&latent_shape), frames);
        let engine = Engine::new(pipe.as_ref(), &sampler, latent_shape, 0).expect("engine");
        let mut check = Checker::new(&name);
        check.case();
        let text = encode_rows(pipe.as_ref(), &PROMPTS, &[], &[], None).expect("prompts");
        let negative =
            encode_rows(pipe.as_ref(), &[pipe.default_negative_prompt(); 2], &[], &[], None)
                .expect("negative");
        for (key, cond) in [("prompt", &text), ("negative_prompt", &negative)] {
            let want = &io[&format!("output.{key}_embeds")];
            check.close_within(&format!("{key}_embeds"), &cond.embeds, want, MODEL_RTOL);
        }
        let out = spec_trajectory(&mut check, &io, &engine, &text, &negative);
        check_video(
            &mut check,
            &io,
            pipe.as_ref(),
            &out.final_latents,
            [frames as i64, height, width],
        );
        check.finish();
    }
}

/// The fixture's trajectory with the script's CFG and window, checked.
fn spec_trajectory(
    check: &mut Checker,
    io: &std::collections::HashMap<String, Tensor>,
    engine: &Engine<'_>,
    text: &flowtune_models::TextConditioning,
    negative: &flowtune_models::TextConditioning,
) -> flowtune_rollout::Trajectory {
    let guidance = Guidance { scale: GUIDANCE, scale_2: None, negative: Some(negative) };
    common::check_trajectory(check, io, engine, text, guidance, &[WINDOW; 2])
}

/// `latents` decoded by `pipe` (frames side by side) within one level of the fixture's
/// `output.video` of `[frames, height, width]`.
fn check_video(
    check: &mut Checker,
    io: &std::collections::HashMap<String, Tensor>,
    pipe: &dyn flowtune_models::FlowPipeline,
    latents: &Tensor,
    size: [i64; 3],
) {
    let pixels = tch::no_grad(|| pipe.decode_rgb8(latents)).expect("decode");
    let video = &io["output.video"];
    let (b, c, t, h, w) = video.size5().expect("(B, 3, T, H, W)");
    assert_eq!([t, h, w], size);
    let want = ((video.clamp(-1.0, 1.0) + 1.0) * 127.5).round().permute([0, 3, 2, 4, 1]);
    let want = want.reshape([b, h, t * w, c]).to_kind(Kind::Int);
    assert_eq!(pixels.size(), want.size(), "frames side by side");
    let off = (pixels.to_kind(Kind::Int) - want).abs().max().int64_value(&[]);
    if off > 1 {
        check.fail(format!("decoded frames differ from diffusers' by {off} levels"));
    }
}

/// The script's `I2V_CASES` (pixel frames, height, width): image-to-video from its 40 × 24 picture.
const I2V_CASES: [(usize, i64, i64); 2] = [(5, 32, 64), (9, 64, 32)];

/// The tiny pipeline (Wan2.2-TI2V layout, `expand_timesteps`) for clips of `frames`.
fn ti2v(frames: usize) -> Box<dyn flowtune_models::FlowPipeline> {
    let options = PipelineOptions { num_frames: Some(frames), ..PipelineOptions::new(Device::Cpu) };
    flowtune_models::load_pipeline(&dir().join("wan_pipeline"), &options).expect("load")
}

/// The fixture's `input.picture` (H, W, 3) u8.
fn picture(io: &std::collections::HashMap<String, Tensor>) -> image::RgbaImage {
    let t = &io["input.picture"];
    let (h, w, _) = t.size3().expect("(H, W, 3)");
    let bytes = Vec::<u8>::try_from(t.flatten(0, -1)).expect("u8");
    let rgb = image::RgbImage::from_raw(w as u32, h as u32, bytes).expect("picture");
    image::DynamicImage::ImageRgb8(rgb).to_rgba8()
}

/// The script's `SPEC` as sampler settings.
fn spec_sampler() -> SamplerConfig {
    SamplerConfig {
        n: 1,
        steps: STEPS,
        guidance_scale: GUIDANCE,
        noise_level: 0.7,
        sde_window_size: WINDOW.len(),
        ..Default::default()
    }
}

/// Wan2.2-TI2V image-to-video against the script's `--i2v` loop: the picture resized and encoded
/// as WanImageToVideoPipeline's `prepare_latents` does, the first latent frame held at it in every
/// recorded latent (timestep 0 on its tokens), log-probs over the generated frames, and the decoded
/// clip, whose first frame is the picture through the VAE.
#[test]
fn wan_i2v_rollouts_match_diffusers_loop() {
    for (frames, height, width) in I2V_CASES {
        let name = format!("wan_i2v_rollout_f{frames}_io.safetensors");
        let io = tensors(&name);
        let pipe = ti2v(frames);
        let sampler = spec_sampler();
        let latent_shape = pipe.latent_shape(height, width).expect("latent shape");
        let engine = Engine::new(pipe.as_ref(), &sampler, latent_shape.clone(), 0).expect("engine");
        let mut check = Checker::new(&name);
        check.case();
        let pictures = vec![vec![picture(&io)]; 2];
        let text =
            encode_rows(pipe.as_ref(), &PROMPTS, &pictures, &latent_shape, None).expect("prompts");
        let negative = encode_rows(pipe.as_ref(), &["", ""], &pictures, &latent_shape, None)
            .expect("negative");
        let held = text.held_latents().expect("the first frame is held");
        check.close_within("condition", held, &io["output.condition"], MODEL_RTOL);
        let out = spec_trajectory(&mut check, &io, &engine, &text, &negative);
        let first = out.all_latents.select(3, 0);
        let want = held.squeeze_dim(2).unsqueeze(1).expand_as(&first);
        assert!(first.equal(&want), "{name}: every recorded latent holds the first frame exactly");
        check_video(
            &mut check,
            &io,
            pipe.as_ref(),
            &out.final_latents,
            [frames as i64, height, width],
        );
        check.finish();
    }
}

/// The trainer's replay of an image-to-video rollout scores each window step with the rollout's
/// own log-prob (ratio 1 on-policy), and the held frame carries no gradient.
#[test]
fn wan_i2v_replay_equals_rollout_and_the_held_frame_has_no_velocity() {
    let io = tensors("wan_i2v_rollout_f5_io.safetensors");
    let pipe = ti2v(5);
    let sampler = SamplerConfig { n: 2, ..spec_sampler() };
    let latent_shape = pipe.latent_shape(32, 64).expect("latent shape");
    let engine = Engine::new(pipe.as_ref(), &sampler, latent_shape, 3).expect("engine");
    let pictures = vec![vec![picture(&io)]; 2];
    let batch = engine.rollout(&PROMPTS, &["", ""], &pictures, &[11, 12], 1).expect("rollout");
    let rows = Rows::new(vec![1, 0], Device::Cpu);
    for j in 0..WINDOW.len() as i64 {
        let out = tch::no_grad(|| engine.replay(&batch, &rows, j)).expect("replay");
        let want = batch.trajectory.all_log_probs.index_select(0, &rows.device).select(1, j);
        assert!(out.log_prob.equal(&want), "step {j}: {:?} vs {:?}", out.log_prob, want);
    }
    let x = Tensor::randn([2, 16, 2, 2, 4], (Kind::Float, Device::Cpu));
    let t = Tensor::from_slice(&[900.0f32, 500.0]);
    let v = tch::no_grad(|| pipe.denoiser().velocity(&x, &t, &batch.text)).expect("velocity");
    assert_eq!(v.select(2, 0).abs().max().double_value(&[]), 0.0, "no velocity on the held frame");
    assert!(v.select(2, 1).abs().max().double_value(&[]) > 0.0);
}

#[test]
fn image_to_video_is_refused_by_name_where_it_cannot_run() {
    let io = tensors("wan_i2v_rollout_f5_io.safetensors");
    let one = vec![picture(&io)];
    let err = |pipe: &dyn flowtune_models::FlowPipeline, pictures: &[image::RgbaImage], shape| {
        let text = pipe.encode_prompts_with_pictures(&PROMPTS, pictures, shape);
        text.err().expect("refused").to_string()
    };
    let e = err(ti2v(1).as_ref(), &one, &[16, 1, 2, 2]);
    assert!(e.contains("image-to-video needs at least 5 frames"), "{e}");
    let two = vec![one[0].clone(), one[0].clone()];
    let e = err(ti2v(5).as_ref(), &two, &[16, 2, 2, 2]);
    assert!(e.contains("one first-frame picture per prompt, got 2"), "{e}");
    let e = err(a14b(None).as_ref(), &one, &[16, 2, 4, 4]);
    assert!(e.contains("image-to-video needs a Wan2.2-TI2V pipeline (`expand_timesteps"), "{e}");
    let mut translucent = one[0].clone();
    translucent.get_pixel_mut(0, 0).0[3] = 254;
    let e = err(ti2v(5).as_ref(), &[translucent], &[16, 2, 2, 2]);
    assert!(
        e.contains("has 1 transparent pixels: a WanPipeline takes opaque pictures only"),
        "{e}"
    );
}

#[test]
fn frame_counts_and_sides_are_checked_by_key() {
    let path = dir().join("wan_pipeline");
    let options = PipelineOptions { num_frames: Some(6), ..PipelineOptions::new(Device::Cpu) };
    let err = flowtune_models::load_pipeline(&path, &options).err().expect("6 frames").to_string();
    assert!(err.contains("num_frames 6 (model.num_frames / --num-frames)"), "{err}");
    assert!(err.contains("4k + 1 frames (1, 5, 9, …, 81)"), "{err}");
    let options =
        PipelineOptions { output_resolution: Some(512), ..PipelineOptions::new(Device::Cpu) };
    let err = flowtune_models::load_pipeline(&path, &options).err().expect("refused").to_string();
    assert!(err.contains("output_resolution 512 (model.output_resolution / --output-resolution) sizes Qwen-Image 2.1's condition pictures; this WanPipeline"), "{err}");
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

/// `SPEC_A14B` of the script: `SPEC` with the low-noise stage's CFG scale.
const GUIDANCE_2: f64 = 3.0;

/// The two-expert pipeline of `make-tiny wan --a14b` (5 frames), optionally with LoRA.
fn a14b(lora: Option<flowtune_models::LoraConfig>) -> Box<dyn flowtune_models::FlowPipeline> {
    let options =
        PipelineOptions { num_frames: Some(5), lora, ..PipelineOptions::new(Device::Cpu) };
    flowtune_models::load_pipeline(&dir().join("wan_a14b_pipeline"), &options)
        .expect("load the two-expert pipeline")
}

#[test]
fn wan_a14b_rollout_matches_diffusers_two_stages() {
    let name = "wan_a14b_rollout_f5_io.safetensors";
    let io = tensors(name);
    let pipe = a14b(None);
    assert_eq!(pipe.denoiser().expert_boundary(), Some(875.0));
    let sampler = SamplerConfig { guidance_scale_2: Some(GUIDANCE_2), ..spec_sampler() };
    let latent_shape = pipe.latent_shape(32, 64).expect("latent shape");
    assert_eq!(latent_shape, [16, 2, 4, 8], "Wan2.1's 8× VAE");
    let engine = Engine::new(pipe.as_ref(), &sampler, latent_shape, 0).expect("engine");
    // Timesteps 999, 961, 909 run `transformer`, 833, 714, 501 `transformer_2`.
    assert_eq!(engine.grid.timesteps, [999.0, 961.0, 909.0, 833.0, 714.0, 501.0]);
    let mut check = Checker::new(name);
    check.case();
    let text = encode_rows(pipe.as_ref(), &PROMPTS, &[], &[], None).expect("prompts");
    let negative = encode_rows(pipe.as_ref(), &["", ""], &[], &[], None).expect("negative");
    let guidance =
        Guidance { scale: GUIDANCE, scale_2: Some(GUIDANCE_2), negative: Some(&negative) };
    let windows = vec![WINDOW; 2];
    let out = common::check_trajectory(&mut check, &io, &engine, &text, guidance, &windows);

    // One scale for both stages is another trajectory.
    let request = flowtune_rollout::TrajectoryRequest {
        grid: &engine.grid,
        text: &text,
        guidance: Guidance { scale: GUIDANCE, scale_2: None, negative: Some(&negative) },
        step: sampler.step_params(engine.grid.sigmas[1] as f64),
        windows: &windows,
        initial: &io["input.initial_latents"],
    };
    let noise = &io["input.step_noise"];
    let single = tch::no_grad(|| {
        flowtune_rollout::sample_trajectory(pipe.denoiser(), &request, |i| noise.get(i as i64))
    })
    .expect("rollout");
    let want = &io["output.final_latents"];
    let off = f64::try_from((single.final_latents - want).norm() / want.norm()).unwrap();
    assert!(off > 1e-3, "guidance_scale_2 changes the samples ({off:.1e})");

    // Replayed rows on both sides of the boundary (window steps 1 and 2: t = 909 and 833) in one
    // batch: each row as its own expert and scale give it.
    let x = Tensor::stack(&[out.all_latents.get(0).get(1), out.all_latents.get(1).get(2)], 0);
    let t = Tensor::from_slice(&[909.0f32, 833.0]);
    let scale = flowtune_models::CfgScale { scale: GUIDANCE, scale_2: Some(GUIDANCE_2) };
    let model = pipe.denoiser();
    let velocity = |x: &Tensor, t: &Tensor, rows: &[i64]| {
        let index = Tensor::from_slice(rows);
        let negative = negative.rows(&index);
        tch::no_grad(|| guided_velocity(model, x, t, &text.rows(&index), Some(&negative), scale))
            .expect("velocity")
    };
    let mixed = velocity(&x, &t, &[0, 1]);
    for row in 0..2 {
        let alone = velocity(&x.narrow(0, row, 1), &t.narrow(0, row, 1), &[row]);
        check.close_within(
            &format!("straddling batch row {row}"),
            &mixed.narrow(0, row, 1),
            &alone,
            1e-5,
        );
    }
    check.finish();
}

#[test]
fn wan_a14b_trains_only_the_expert_of_each_row() {
    let lora = flowtune_models::LoraConfig {
        rank: 2,
        alpha: 4.0,
        target_modules: vec!["attn1.to_q".into(), "ffn.net.2".into()],
        ..Default::default()
    };
    let pipe = a14b(Some(lora));
    let model = pipe.denoiser();
    let params = model.trainable_parameters();
    let count = |prefix: &str| params.keys().filter(|k| k.starts_with(prefix)).count();
    assert_eq!(count("transformer."), count("transformer_2."), "{:?}", params.keys());
    assert_eq!(count("transformer.") + count("transformer_2."), params.len());
    let text = encode_rows(pipe.as_ref(), &PROMPTS, &[], &[], None).expect("prompts");
    let x = Tensor::randn([2, 16, 2, 4, 8], (Kind::Float, Device::Cpu));
    let grads = |t: &[f32]| {
        for p in params.values() {
            let mut p = p.shallow_clone();
            p.zero_grad();
        }
        let v = model.velocity(&x, &Tensor::from_slice(t), &text).expect("velocity");
        v.square().sum(Kind::Float).backward();
        let defined = |prefix: &str| {
            params.iter().filter(|(k, _)| k.starts_with(prefix)).any(|(_, p)| p.grad().defined())
        };
        (defined("transformer."), defined("transformer_2."))
    };
    assert_eq!(grads(&[999.0, 909.0]), (true, false), "high-noise rows: transformer only");
    assert_eq!(grads(&[961.0, 833.0]), (true, true), "straddling rows: both experts");
}

#[test]
fn two_expert_settings_are_checked_by_key() {
    let single = flowtune_models::load_pipeline(
        &dir().join("wan_pipeline"),
        &PipelineOptions::new(Device::Cpu),
    )
    .expect("one transformer");
    let sampler = SamplerConfig { guidance_scale_2: Some(3.0), ..Default::default() };
    let err = Engine::new(single.as_ref(), &sampler, vec![16, 1, 2, 2], 0).err().expect("refused");
    let err = err.to_string();
    assert!(err.contains("guidance_scale_2 3 (rollout.guidance_scale_2 / --guidance-2)"), "{err}");
    assert!(err.contains("has one denoiser"), "{err}");

    // An index with one of `transformer_2` and `boundary_ratio` but not the other.
    let source = dir().join("wan_a14b_pipeline");
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("model_index.json")).unwrap())
            .unwrap();
    for (key, value, want) in [
        (
            "boundary_ratio",
            serde_json::Value::Null,
            "transformer_2 (a second expert, Wan2.2-A14B) needs a boundary_ratio",
        ),
        (
            "transformer_2",
            serde_json::json!([null, null]),
            "boundary_ratio 0.875 is for two experts, but there is no transformer_2",
        ),
        ("boundary_ratio", serde_json::json!(1.5), "boundary_ratio Some(1.5): expected a fraction"),
    ] {
        let tmp = flowtune_fixtures::scratch(&format!("a14b-index-{key}"));
        for entry in std::fs::read_dir(&source).unwrap().flatten() {
            if entry.file_name() != "model_index.json" {
                std::os::unix::fs::symlink(entry.path(), tmp.join(entry.file_name())).unwrap();
            }
        }
        let mut index = index.clone();
        index[key] = value;
        std::fs::write(tmp.join("model_index.json"), index.to_string()).unwrap();
        let err = flowtune_models::load_pipeline(&tmp, &PipelineOptions::new(Device::Cpu))
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("model_index.json") && err.contains(want), "{err}");
    }
}

/// `rollout.same_noise`: rows of one prompt start from the first row's initial noise (rows of
/// another prompt do not), and their SDE steps still differ.
#[test]
fn same_noise_shares_a_groups_initial_noise_only() {
    let pipe = ti2v(5);
    let entering = |same_noise: bool| {
        let sampler = SamplerConfig {
            n: 2,
            steps: 4,
            guidance_scale: 1.0,
            sde_window_size: 2,
            sde_window_range: Some([1, 3]),
            same_noise,
            ..Default::default()
        };
        let shape = pipe.latent_shape(32, 32).expect("latent shape");
        let engine = Engine::new(pipe.as_ref(), &sampler, shape, 9).expect("engine");
        let prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[1]];
        let seeds = engine.row_seeds(3, 1);
        let batch = engine.rollout(&prompts, &["", "", ""], &[], &seeds, 1).expect("rollout");
        // The latent entering the window (step 1) follows from the initial noise by one Euler step.
        let t = &batch.trajectory.all_latents;
        [t.get(0).get(0), t.get(1).get(0), t.get(2).get(0), t.get(0).get(2), t.get(1).get(2)]
    };
    let [a, b, c, a_end, b_end] = entering(true);
    assert!(a.equal(&b), "one prompt, one initial noise");
    assert!(!a.equal(&c), "another prompt, its own noise");
    assert!(!a_end.equal(&b_end), "the SDE steps differ within the group");
    let [a, b, ..] = entering(false);
    assert!(!a.equal(&b), "without same_noise every row has its own noise");
}
