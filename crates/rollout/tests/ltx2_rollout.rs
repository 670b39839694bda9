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
use flowtune_models::{FlowPipeline, PipelineOptions};
use flowtune_rollout::{encode_rows, sample_trajectory, Engine, Guidance, TrajectoryRequest};
use flowtune_sampling::SamplerConfig;
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
        let request = TrajectoryRequest {
            grid: &engine.grid,
            text: &text,
            guidance: Guidance {
                scale,
                scale_2: None,
                negative: (scale > 1.0).then_some(&negative),
            },
            step: sampler.step_params(engine.grid.sigmas[1] as f64),
            windows: &[0..0, 0..0],
            initial: &initial,
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
        check.finish();
    }
}
