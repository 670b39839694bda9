//! A Qwen-Image trajectory end to end against `scripts/reference_qwen_rollout.py`: the tiny
//! pipeline of `flowtune make-tiny qwen-image` loaded through the registry, prompts encoded with
//! the chat template, "true CFG" against the `" "` negative prompt, dynamic-shift grid, SDE
//! window, given noise, and the decoded pictures — all equal to diffusers' components in a loop.

mod common;

use flowtune_fixtures::{dir, tensors, Checker, MODEL_RTOL};
use flowtune_models::PipelineOptions;
use flowtune_rollout::{encode_rows, Engine, Guidance};
use flowtune_sampling::SamplerConfig;
use tch::{Device, Kind};

/// The script's `PROMPTS` and `SPEC`.
const PROMPTS: [&str; 2] =
    ["a red circle next to a blue square", "一只猫坐在垫子上, \"OPEN\" 24/7"];
const STEPS: usize = 6;
const GUIDANCE: f64 = 4.0;
const WINDOW: std::ops::Range<usize> = 1..4;

#[test]
fn qwen_image_rollout_matches_diffusers_loop() {
    let io = tensors("qwen_image_rollout_io.safetensors");
    let pipe = flowtune_models::load_pipeline(
        &dir().join("qwen_image_pipeline"),
        &PipelineOptions::new(Device::Cpu),
    )
    .expect("load the tiny pipeline");
    let sampler = SamplerConfig {
        n: 1,
        steps: STEPS,
        guidance_scale: GUIDANCE,
        noise_level: 0.7,
        sde_window_size: WINDOW.len(),
        ..Default::default()
    };
    let latent_shape = pipe.latent_shape(48, 80).expect("48 × 80");
    assert_eq!(latent_shape, [16, 6, 10]);
    let engine = Engine::new(pipe.as_ref(), &sampler, latent_shape, 0).expect("engine");
    let mut check = Checker::new("qwen_image_rollout_io.safetensors");
    check.case();
    let text = encode_rows(pipe.as_ref(), &PROMPTS, &[], &[], None).expect("prompts");
    let negative = encode_rows(pipe.as_ref(), &[pipe.default_negative_prompt(); 2], &[], &[], None)
        .expect("negative");
    check.close_within("prompt_embeds", &text.embeds, &io["output.prompt_embeds"], MODEL_RTOL);
    check.close_within(
        "negative_prompt_embeds",
        &negative.embeds,
        &io["output.negative_prompt_embeds"],
        MODEL_RTOL,
    );
    let guidance = Guidance { scale: GUIDANCE, scale_2: None, negative: Some(&negative) };
    let out = common::check_trajectory(&mut check, &io, &engine, &text, guidance, &vec![WINDOW; 2]);
    common::check_decoded(&mut check, &io, pipe.as_ref(), &out.final_latents);
    check.finish();
}

/// The reference's pitfall: with the model in bf16, rollout latents and log-probs stay f32 (never
/// the model dtype), and the trajectory stays close to the f32 one.
#[test]
fn bf16_model_keeps_f32_latents_and_log_probs() {
    let dir = dir().join("qwen_image_pipeline");
    let sampler = SamplerConfig {
        n: 1,
        steps: STEPS,
        guidance_scale: GUIDANCE,
        noise_level: 0.7,
        sde_window_size: WINDOW.len(),
        ..Default::default()
    };
    let run = |kind: Kind| {
        let options = PipelineOptions {
            dtypes: flowtune_models::Dtypes::all(kind),
            ..PipelineOptions::new(Device::Cpu)
        };
        let pipe = flowtune_models::load_pipeline(&dir, &options).expect("load");
        let engine = Engine::new(pipe.as_ref(), &sampler, vec![16, 6, 10], 3).expect("engine");
        let negatives = [pipe.default_negative_prompt(); 2];
        engine
            .rollout(&PROMPTS, &negatives, &[], &engine.row_seeds(2, 1), 1)
            .expect("rollout")
            .trajectory
    };
    let (full, half) = (run(Kind::Float), run(Kind::BFloat16));
    for t in [&half.all_latents, &half.all_log_probs, &half.final_latents] {
        assert_eq!(t.kind(), Kind::Float, "recorded in f32");
        assert!(t.isfinite().all().int64_value(&[]) == 1);
    }
    let rel = (&half.final_latents - &full.final_latents).norm().double_value(&[])
        / full.final_latents.norm().double_value(&[]);
    assert!(rel > 0.0 && rel < 0.05, "bf16 vs f32 final latents: {rel}");
}

/// Qwen-Image-Edit-Plus against `scripts/reference_qwen_edit_rollout.py`: a condition picture
/// through the vision tower with the prompt (and with the negative prompt), VAE-encoded at about
/// 1024² onto the image stream with `zero_cond_t`, true CFG and an SDE window.
#[test]
fn qwen_image_edit_plus_rollout_matches_diffusers_loop() {
    let io = tensors("qwen_image_edit_rollout_io.safetensors");
    let pipe = flowtune_models::load_pipeline(
        &dir().join("qwen_image_edit_pipeline"),
        &PipelineOptions::new(Device::Cpu),
    )
    .expect("load the tiny Edit-Plus pipeline");
    let raw = &io["input.picture_0"];
    let (h, w, _) = raw.size3().unwrap();
    let bytes = Vec::<u8>::try_from(raw.flatten(0, -1)).unwrap();
    let picture = image::RgbImage::from_raw(w as u32, h as u32, bytes).unwrap();
    let picture = image::DynamicImage::ImageRgb8(picture).to_rgba8();
    let prompts = ["make the square red"];
    let sampler = SamplerConfig {
        n: 1,
        steps: 4,
        guidance_scale: GUIDANCE,
        noise_level: 0.7,
        sde_window_size: 2,
        ..Default::default()
    };
    let engine =
        Engine::new(pipe.as_ref(), &sampler, pipe.latent_shape(32, 48).unwrap(), 0).unwrap();
    let mut check = Checker::new("qwen_image_edit_rollout_io.safetensors");
    check.case();
    let pictures = [picture];
    let text =
        tch::no_grad(|| pipe.encode_prompts_with_pictures(&prompts, &pictures, &[])).unwrap();
    let negative =
        tch::no_grad(|| pipe.encode_prompts_with_pictures(&[" "], &pictures, &[])).unwrap();
    check.close_within("prompt_embeds", &text.embeds, &io["output.prompt_embeds"], MODEL_RTOL);
    check.close_within(
        "negative_prompt_embeds",
        &negative.embeds,
        &io["output.negative_prompt_embeds"],
        MODEL_RTOL,
    );
    check.close_within(
        "condition_latents",
        &text.extras["condition_latents"],
        &io["output.condition_latents"],
        MODEL_RTOL,
    );
    let guidance = Guidance { scale: GUIDANCE, scale_2: None, negative: Some(&negative) };
    common::check_trajectory(&mut check, &io, &engine, &text, guidance, &vec![1..3; 1]);
    check.finish();
}
