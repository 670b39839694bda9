//! LTX-2 against diffusers' own `LTX2Pipeline.__call__` (`scripts/reference_ltx2_pipeline.py`) on
//! the tiny pipeline of `flowtune make-tiny ltx2`: prompts through Gemma-3 and the connectors, the
//! pipeline's sigma grid, the ODE from the same initial video and audio noise with and without
//! CFG, then the final video and audio latents, the decoded frames and the vocoder's waveform —
//! for 1, 9 and 17 pixel frames, square and not, at 24 and 12.5 fps; and the first case on the
//! LTX-2.3 layout of `make-tiny ltx2 --ltx23` (gated attention, text modulation, split rotary,
//! per-modality connectors, the bandwidth-extending vocoder).

use flowtune_fixtures::{dir, tensors, Checker, MATH_RTOL};
use flowtune_models::ltx2::audio_vae::unpack_latents;
use flowtune_models::ltx2::latents::{join, split};
use flowtune_models::ltx2::Ltx2Pipeline;
use flowtune_models::{FlowPipeline, PipelineOptions, TextConditioning};
use flowtune_rollout::{
    encode_rows, sample_trajectory, Engine, Guidance, Rows, Trajectory, TrajectoryRequest,
};
use flowtune_sampling::SamplerConfig;
use std::collections::HashMap;

use tch::{Device, Kind, Tensor};

/// The script's `PROMPTS`, `MAX_SEQUENCE_LENGTH`, `STEPS` and `CASES` (pixel frames, height,
/// width, frame rate, CFG scale).
const PROMPTS: [&str; 2] = [
    "a red fox barks at the falling snow",
    "waves crash on rocks while gulls cry overhead at dusk",
];
const MAX_SEQUENCE_LENGTH: usize = 16;
const STEPS: usize = 4;
const CASES: [(usize, i64, i64, f64, f64); 3] =
    [(9, 64, 96, 24.0, 3.0), (17, 64, 64, 12.5, 4.0), (1, 64, 64, 24.0, 1.0)];

#[test]
fn ltx2_ode_runs_match_the_pipeline_call() {
    let runs = CASES.iter().map(|c| ("ltx2_pipeline", c)).chain([("ltx2_pipeline_v23", &CASES[0])]);
    for (folder, &(frames, height, width, fps, scale)) in runs {
        let name = format!("{folder}_f{frames}_io.safetensors");
        let io = tensors(&name);
        let options = PipelineOptions {
            num_frames: Some(frames),
            frame_rate: Some(fps),
            max_sequence_length: Some(MAX_SEQUENCE_LENGTH),
            ..PipelineOptions::new(Device::Cpu)
        };
        let pipe = Ltx2Pipeline::load(&dir().join(folder), &options).expect("load");
        let shape = pipe.latent_shape(height, width).expect("latent shape");
        let sampler = SamplerConfig {
            n: 1,
            steps: STEPS,
            guidance_scale: scale,
            noise_level: 0.0,
            sde_window_size: 0,
            ..Default::default()
        };
        let engine = Engine::new(&pipe, &sampler, shape, 0).expect("engine");
        let mut check = Checker::new(&name);
        check.case();
        let text = encode_rows(&pipe, &PROMPTS, &[], &[], None).expect("prompts");
        let negative = encode_rows(&pipe, &[""; 2], &[], &[], None).expect("negative");
        // The pipeline runs the connectors on [negative, prompt].
        let both = |f: &dyn Fn(&flowtune_models::TextConditioning) -> Tensor| {
            Tensor::cat(&[f(&negative), f(&text)], 0)
        };
        let audio_embeds = |c: &flowtune_models::TextConditioning| c.extras["audio_embeds"].copy();
        check.close_within(
            "video_embeds",
            &both(&|c| c.embeds.copy()),
            &io["output.video_embeds"],
            1e-5,
        );
        check.close_within("audio_embeds", &both(&audio_embeds), &io["output.audio_embeds"], 1e-5);
        let mask = both(&|c| c.mask.as_ref().expect("mask").to_kind(Kind::Float));
        check.close_within("mask", &mask, &io["output.mask"], 1e-12);

        let initial = join(&io["input.video_noise"], &io["input.audio_noise"]);
        let guidance =
            Guidance { scale, scale_2: None, negative: (scale > 1.0).then_some(&negative) };
        check_ode(&mut check, &io, &pipe, &engine, &text, guidance, &initial);
        check.finish();
    }
}

/// The script's `I2V_CASES` (pixel frames, height, width, frame rate, CFG scale).
const I2V_CASES: [(usize, i64, i64, f64, f64); 2] =
    [(9, 64, 96, 24.0, 3.0), (17, 64, 64, 12.5, 1.0)];

/// The tiny pipeline in fixture `folder` for `frames` pixel frames at `fps`.
fn tiny(folder: &str, frames: usize, fps: f64) -> Ltx2Pipeline {
    let options = PipelineOptions {
        num_frames: Some(frames),
        frame_rate: Some(fps),
        max_sequence_length: Some(MAX_SEQUENCE_LENGTH),
        ..PipelineOptions::new(Device::Cpu)
    };
    Ltx2Pipeline::load(&dir().join(folder), &options).expect("load")
}

/// The fixture's `input.picture` (H, W, 3) u8.
fn picture(io: &HashMap<String, Tensor>) -> image::RgbaImage {
    let t = &io["input.picture"];
    let (h, w, _) = t.size3().expect("(H, W, 3)");
    let bytes = Vec::<u8>::try_from(t.flatten(0, -1)).expect("u8");
    let rgb = image::RgbImage::from_raw(w as u32, h as u32, bytes).expect("picture");
    image::DynamicImage::ImageRgb8(rgb).to_rgba8()
}

/// Image-to-video with sound against `LTX2ImageToVideoPipeline.__call__` (`image_crf=0`): the
/// picture resized and encoded as the pipeline's `prepare_latents` does and held as the first
/// latent frame's tokens (timestep 0 there, the audio at the step's timestep), then the ODE from
/// the pipeline's own initial latents, with and without CFG; the first case on LTX-2.3 too.
#[test]
fn ltx2_image_to_video_odes_match_the_pipeline_call() {
    let runs = I2V_CASES.iter().map(|c| ("ltx2_pipeline", c));
    for (folder, &(frames, height, width, fps, scale)) in
        runs.chain([("ltx2_pipeline_v23", &I2V_CASES[0])])
    {
        let name = format!("{folder}_i2v_f{frames}_io.safetensors");
        let io = tensors(&name);
        let pipe = tiny(folder, frames, fps);
        let shape = pipe.latent_shape(height, width).expect("latent shape");
        let sampler =
            SamplerConfig { n: 1, steps: STEPS, guidance_scale: scale, ..Default::default() };
        let engine = Engine::new(&pipe, &sampler, shape.clone(), 0).expect("engine");
        let mut check = Checker::new(&name);
        check.case();
        let pictures = vec![vec![picture(&io)]; 2];
        let text = encode_rows(&pipe, &PROMPTS, &pictures, &shape, None).expect("prompts");
        let negative = encode_rows(&pipe, &[""; 2], &pictures, &shape, None).expect("negative");
        let held = text.held_latents().expect("the first frame is held");
        let sh = held.size()[1];
        let mask = &io["input.mask"];
        assert_eq!(mask.sum(Kind::Float).double_value(&[]), (2 * sh) as f64, "{name}: held tokens");
        assert!(mask.narrow(1, 0, sh).eq(1.0).all().int64_value(&[]) == 1, "{name}: leading");
        let video = &io["input.video_latents"];
        check.close_within("condition", held, &video.narrow(1, 0, sh), 1e-5);

        let initial = join(video, &io["input.audio_noise"]);
        let guidance =
            Guidance { scale, scale_2: None, negative: (scale > 1.0).then_some(&negative) };
        let out = check_ode(&mut check, &io, &pipe, &engine, &text, guidance, &initial);
        let first = out.final_latents.narrow(1, 0, sh);
        assert!(first.equal(held), "{name}: the final latents hold the first frame exactly");
        check.finish();
    }
}

/// The trainer's replay of an image-to-video rollout scores each window step with the rollout's
/// own log-prob (ratio 1 on-policy), and the held tokens get no velocity while the audio does.
#[test]
fn ltx2_i2v_replay_equals_rollout_and_the_held_tokens_have_no_velocity() {
    let io = tensors("ltx2_pipeline_i2v_f9_io.safetensors");
    let pipe = tiny("ltx2_pipeline", 9, 24.0);
    let shape = pipe.latent_shape(64, 96).expect("latent shape");
    let sampler = SamplerConfig {
        n: 2,
        steps: STEPS,
        guidance_scale: 3.0,
        noise_level: 0.7,
        sde_window_size: 2,
        ..Default::default()
    };
    let engine = Engine::new(&pipe, &sampler, shape.clone(), 3).expect("engine");
    let pictures = vec![vec![picture(&io)]; 2];
    let batch = engine.rollout(&PROMPTS, &["", ""], &pictures, &[11, 12], 1).expect("rollout");
    let held = batch.text.held_latents().expect("held").shallow_clone();
    let sh = held.size()[1];
    let recorded = batch.trajectory.all_latents.narrow(2, 0, sh);
    assert!(
        recorded.eq_tensor(&held.unsqueeze(1)).all().int64_value(&[]) == 1,
        "held in every step"
    );
    let rows = Rows::new(vec![1, 0], Device::Cpu);
    for j in 0..2 {
        let out = tch::no_grad(|| engine.replay(&batch, &rows, j)).expect("replay");
        let want = batch.trajectory.all_log_probs.index_select(0, &rows.device).select(1, j);
        assert!(out.log_prob.equal(&want), "step {j}: {:?} vs {:?}", out.log_prob, want);
    }
    let x = Tensor::randn([2, shape[0], shape[1]], (Kind::Float, Device::Cpu));
    let t = Tensor::from_slice(&[900.0f32, 500.0]);
    let v = tch::no_grad(|| pipe.denoiser().velocity(&x, &t, &batch.text)).expect("velocity");
    assert_eq!(v.narrow(1, 0, sh).abs().max().double_value(&[]), 0.0, "no velocity when held");
    let audio_tokens = pipe.geometry().expect("geometry").audio_frames;
    for (what, start, len) in [("video", sh, 2), ("audio", shape[0] - audio_tokens, audio_tokens)] {
        let moving = v.narrow(1, start, len).abs().max().double_value(&[]);
        assert!(moving > 0.0, "the generated {what} tokens have velocities");
    }
}

/// One-frame clips, several pictures per prompt and translucent pictures are refused by name.
#[test]
fn ltx2_image_to_video_is_refused_where_it_cannot_run() {
    let io = tensors("ltx2_pipeline_i2v_f9_io.safetensors");
    let one = vec![picture(&io)];
    let err = |frames: usize, pictures: &[image::RgbaImage]| {
        let pipe = tiny("ltx2_pipeline", frames, 24.0);
        let shape = pipe.latent_shape(64, 64).expect("latent shape");
        let text = pipe.encode_prompts_with_pictures(&PROMPTS, pictures, &shape);
        text.err().expect("refused").to_string()
    };
    let e = err(1, &one);
    assert!(e.contains("image-to-video needs at least 9 frames"), "{e}");
    let e = err(9, &[one[0].clone(), one[0].clone()]);
    assert!(e.contains("one first-frame picture per prompt, got 2"), "{e}");
    let mut translucent = one[0].clone();
    translucent.get_pixel_mut(0, 0).0[3] = 254;
    let e = err(9, &[translucent]);
    assert!(e.contains("transparent pixels: a LTX2Pipeline takes opaque pictures only"), "{e}");
}

/// The ODE from `initial` with `text` and `guidance` on `engine`'s grid against the fixture's
/// final video and audio latents, decoded frames (≤ 2 levels) and waveform.
fn check_ode(
    check: &mut Checker,
    io: &HashMap<String, Tensor>,
    pipe: &Ltx2Pipeline,
    engine: &Engine,
    text: &TextConditioning,
    guidance: Guidance<'_>,
    initial: &Tensor,
) -> Trajectory {
    let sampler = SamplerConfig { noise_level: 0.0, sde_window_size: 0, ..Default::default() };
    let request = TrajectoryRequest {
        grid: &engine.grid,
        text,
        guidance,
        step: sampler.step_params(engine.grid.sigmas[1] as f64),
        windows: &[0..0, 0..0],
        initial,
    };

    let out =
        tch::no_grad(|| sample_trajectory(pipe.denoiser(), &request, |_| initial.zeros_like()))
            .expect("the ODE");
    let g = pipe.geometry().expect("geometry");
    let (video, audio) = split(&out.final_latents, pipe.patches().video_tokens(&g)).unwrap();
    let video = pipe.vae.denormalize_latents(&pipe.patches().unpack_video(&video, &g)).unwrap();
    check.close_within("video_latents", &video, &io["output.video_latents"], MATH_RTOL);
    let audio = pipe.audio_vae.denormalize_latents(&audio).unwrap();
    let audio = unpack_latents(&audio, pipe.audio_vae.config.latent_mel_bins()).unwrap();
    check.close_within("audio_latents", &audio, &io["output.audio_latents"], MATH_RTOL);

    let pixels = tch::no_grad(|| pipe.decode_rgb8(&out.final_latents)).expect("decode");
    let want = &io["output.frames"]; // (B, T, H, W, 3) in [0, 1]
    let (b, t, h, w, c) = want.size5().unwrap();
    let want = (want * 255.0).round().permute([0, 2, 1, 3, 4]).reshape([b, h, t * w, c]);
    let off = (pixels.to_kind(Kind::Float) - want).abs().max().double_value(&[]);
    if off > 2.0 {
        check.fail(format!("decoded frames differ from diffusers' by {off} levels"));
    }
    let sound = tch::no_grad(|| pipe.decode_audio(&out.final_latents)).expect("audio").unwrap();
    let wave = Tensor::stack(
        &sound
            .iter()
            .map(|s| {
                Tensor::stack(
                    &s.channels.iter().map(|c| Tensor::from_slice(c)).collect::<Vec<_>>(),
                    0,
                )
            })
            .collect::<Vec<_>>(),
        0,
    );
    check.close_within("waveform", &wave, &io["output.audio"], MATH_RTOL);
    assert_eq!(sound[0].sample_rate as i64, pipe.vocoder.output_sampling_rate());
    out
}
