//! Qwen-Image 2.1 end to end against `scripts/reference_qwen_image21.py`: the tiny
//! `QwenImage21Pipeline` saved by diffusers, its prompt encoding (`encode_prompt` of prompts of
//! different lengths and of the empty prompt), the author-set sigma grid, and a whole ODE sampling
//! run (4 Euler steps from given latents, CFG 4 against the empty prompt) equal to `__call__`'s
//! final latents and pictures (within 2 levels); with condition images
//! (`scripts/reference_qwen_image21_images.py`): two non-square pictures on a square target with
//! CFG 4 (the negative rows carry them too), one on a non-square target without guidance, one on
//! a square target at another `output_resolution` than its side, and an RGBA picture read from a
//! PNG file as prompt rows read it (over white for the encoder, with its alpha for the VAE).

use std::collections::HashMap;

use flowtune_fixtures::{dir, tensors, Checker, MODEL_RTOL};
use flowtune_models::qwen_image21::QwenImage21Pipeline;
use flowtune_models::{FlowPipeline, PipelineOptions, TextConditioning};
use flowtune_rollout::{encode_rows, sample_trajectory, Engine, Guidance, TrajectoryRequest};
use flowtune_sampling::SamplerConfig;
use tch::{Device, Kind, Tensor};

/// The script's `PROMPTS`.
const PROMPTS: [&str; 2] = [
    "a red circle next to a blue square",
    "一只猫坐在垫子上, \"OPEN\" 24/7, with a longer caption than the first prompt has",
];
const GUIDANCE: f64 = 4.0;
const STEPS: usize = 4;

fn pipeline() -> QwenImage21Pipeline {
    at_output_resolution(None)
}

/// The pipeline, sizing condition pictures to `resolution`² (`None`: the default 1024).
fn at_output_resolution(resolution: Option<i64>) -> QwenImage21Pipeline {
    let path = dir().join("qwen_image21_pipeline");
    let options =
        PipelineOptions { output_resolution: resolution, ..PipelineOptions::new(Device::Cpu) };
    QwenImage21Pipeline::load(&path, &options).expect("load")
}

#[test]
fn prompt_encoding_matches_the_pipeline() {
    let io = tensors("qwen_image21_pipeline_io.safetensors");
    let pipe = pipeline();
    let mut check = Checker::new("qwen_image21_pipeline_io.safetensors prompts");
    for (key, rows) in [("prompt", PROMPTS), ("negative_prompt", [""; 2])] {
        check.case();
        let text = tch::no_grad(|| pipe.encode_prompts(&rows)).expect("encode");
        let want = &io[&format!("output.{key}_embeds")];
        check.close_within(&format!("{key}_embeds"), &text.embeds, want, MODEL_RTOL);
        match (&text.mask, io.get(&format!("output.{key}_mask"))) {
            (Some(mask), Some(want)) => assert!(mask.equal(want), "{key} mask"),
            (None, None) => {}
            (mask, want) => panic!("{key}: mask {mask:?}, the pipeline's {want:?}"),
        }
    }
    assert!(io.contains_key("output.prompt_mask"), "prompts of different lengths are masked");
    check.finish();
}

/// The final latents of an ODE run of `pipe` from `initial` on the `height` × `width` grid, the
/// rows (and with CFG `guidance` > 1 the negative rows) conditioned by `encode(rows, shape)`.
fn ode_run(
    pipe: &QwenImage21Pipeline,
    (height, width): (i64, i64),
    guidance: f64,
    encode: impl Fn(&[&str], &[i64]) -> TextConditioning,
    initial: &Tensor,
    sigmas: &Tensor,
) -> Tensor {
    let sampler =
        SamplerConfig { n: 1, steps: STEPS, guidance_scale: guidance, ..Default::default() };
    let shape = pipe.latent_shape(height, width).expect("shape");
    let engine = Engine::new(pipe, &sampler, shape.clone(), 0).expect("engine");
    let grid = Tensor::from_slice(&engine.grid.sigmas);
    assert!(grid.equal(sigmas), "{grid:?} vs the pipeline's {sigmas:?}");
    let text = encode(&PROMPTS, &shape);
    let negatives = [pipe.default_negative_prompt(); 2];
    let negative = (guidance > 1.0).then(|| encode(&negatives, &shape));
    let request = TrajectoryRequest {
        grid: &engine.grid,
        text: &text,
        guidance: Guidance { scale: guidance, scale_2: None, negative: negative.as_ref() },
        step: sampler.step_params(engine.grid.sigmas[1] as f64),
        windows: &[0..0, 0..0],
        initial,
    };
    // No SDE window: every step is Euler and the drawn noise unused.
    let noise = |_| initial.zeros_like();
    let out = tch::no_grad(|| sample_trajectory(pipe.denoiser(), &request, noise)).expect("ode");
    out.final_latents
}

/// [`encode_rows`] with every row on `pictures`.
fn rows_with<'a>(
    pipe: &'a QwenImage21Pipeline,
    pictures: &'a [image::RgbaImage],
) -> impl Fn(&[&str], &[i64]) -> TextConditioning + 'a {
    move |rows, shape| {
        let sets = if pictures.is_empty() { vec![] } else { vec![pictures.to_vec(); rows.len()] };
        encode_rows(pipe, rows, &sets, shape, None).expect("rows")
    }
}

/// The largest difference in levels between the decoded `latents` and u8 RGB `want`.
fn levels_off(pipe: &QwenImage21Pipeline, latents: &Tensor, want: &Tensor) -> i64 {
    let pixels = tch::no_grad(|| pipe.decode_rgb8(latents)).expect("decode");
    (pixels.to_kind(Kind::Int) - want.to_kind(Kind::Int)).abs().max().int64_value(&[])
}

#[test]
fn ode_run_matches_the_pipeline_call() {
    let io = tensors("qwen_image21_pipeline_io.safetensors");
    let pipe = pipeline();
    let mut check = Checker::new("qwen_image21_pipeline_io.safetensors ODE run");
    check.case();
    // Another step count than the author's sigmas samples on linspace(1, 1/N, N), shifted.
    let six = SamplerConfig { n: 1, steps: 6, guidance_scale: GUIDANCE, ..Default::default() };
    let shape = pipe.latent_shape(64, 96).expect("64 × 96");
    let grid = Engine::new(&pipe, &six, shape, 0).expect("engine").grid;
    assert_eq!((grid.sigmas.len(), grid.sigmas[0]), (7, 1.0), "{:?}", grid.sigmas);
    let initial = &io["input.initial_latents"];
    let encode = rows_with(&pipe, &[]);
    let latents = ode_run(&pipe, (64, 96), GUIDANCE, encode, initial, &io["output.sigmas"]);
    check.close_within("final_latents", &latents, &io["output.final_latents"], MODEL_RTOL);
    let want = (io["output.images"].narrow(3, 0, 3) * 255.0).round();
    let off = levels_off(&pipe, &latents, &want);
    if off > 2 {
        check.fail(format!("pictures differ from the pipeline's by {off} levels"));
    }
    println!("ODE run: pictures within {off} levels of QwenImage21Pipeline.__call__");
    check.finish();
}

fn picture(io: &HashMap<String, Tensor>, key: char) -> image::RgbaImage {
    let t = &io[&format!("input.picture_{key}")];
    let (h, w) = (t.size()[0] as u32, t.size()[1] as u32);
    let bytes = Vec::<u8>::try_from(t.reshape([-1])).expect("u8");
    let rgb = image::RgbImage::from_raw(w, h, bytes).expect("RGB");
    image::DynamicImage::ImageRgb8(rgb).to_rgba8()
}

#[test]
fn ode_runs_with_condition_images_match_the_pipeline_call() {
    let io = tensors("qwen_image21_images_io.safetensors");
    let mut check = Checker::new("qwen_image21_images_io.safetensors ODE runs");
    // (case, pictures, target, output_resolution, CFG); res96 sizes its picture by 96, not 64.
    for (name, keys, size, resolution, guidance) in [
        ("ode2", "ab", (96, 96), 96, GUIDANCE),
        ("ode1", "c", (32, 128), 64, 1.0),
        ("res96", "c", (64, 64), 96, 1.0),
    ] {
        check.case();
        let pipe = at_output_resolution(Some(resolution));
        let pictures: Vec<_> = keys.chars().map(|k| picture(&io, k)).collect();
        let initial = &io[&format!("input.{name}_initial_latents")];
        let sigmas = &io[&format!("output.{name}_sigmas")];
        let latents = ode_run(&pipe, size, guidance, rows_with(&pipe, &pictures), initial, sigmas);
        let want = &io[&format!("output.{name}_final_latents")];
        check.close_within(&format!("{name} final_latents"), &latents, want, MODEL_RTOL);
        let off = levels_off(&pipe, &latents, &io[&format!("output.{name}_images")]);
        if off > 2 {
            check.fail(format!("{name} pictures differ from the pipeline's by {off} levels"));
        }
        println!("{name}: pictures within {off} levels of QwenImage21Pipeline.__call__(image=…)");
    }
    check.case();
    // The RGBA picture as a prompt row's PNG file, read as the trainer and `sample` read it.
    let t = &io["input.picture_rgba"];
    let (h, w) = (t.size()[0] as u32, t.size()[1] as u32);
    let bytes = Vec::<u8>::try_from(t.reshape([-1])).expect("u8");
    let scratch = flowtune_fixtures::scratch("rgba");
    let file = scratch.join("picture.png");
    image::RgbaImage::from_raw(w, h, bytes).expect("RGBA").save(&file).expect("png");
    let pipe = at_output_resolution(Some(64));
    let rgba = flowtune_data::load_picture(&file, pipe.takes_alpha()).expect("RGBA picture");
    assert!(rgba.pixels().any(|p| p.0[3] == 0) && rgba.pixels().any(|p| p.0[3] == 255));
    let initial = &io["input.rgba_initial_latents"];
    let encode = rows_with(&pipe, std::slice::from_ref(&rgba));
    let latents = ode_run(&pipe, (64, 64), 1.0, encode, initial, &io["output.rgba_sigmas"]);
    let want = &io["output.rgba_final_latents"];
    check.close_within("rgba final_latents", &latents, want, MODEL_RTOL);
    let off = levels_off(&pipe, &latents, &io["output.rgba_images"]);
    if off > 2 {
        check.fail(format!("RGBA pictures differ from the pipeline's by {off} levels"));
    }
    println!("rgba: pictures within {off} levels of QwenImage21Pipeline.__call__(image=RGBA)");
    check.finish();
}

/// What flowtune does not run is refused by name: a condition picture too narrow for the target's
/// area, a patchifying transformer or VAE; picture sides that are not multiples of 32.
#[test]
fn unsupported_parts_are_refused_by_name() {
    use flowtune_models::qwen_image21::{QwenImage21TransformerConfig, QwenImage21VaeConfig};

    let pipe = at_output_resolution(Some(64));
    let picture = image::RgbaImage::new(640, 8);
    let shape = pipe.latent_shape(64, 64).unwrap();
    let err = pipe.encode_prompts_with_pictures(&["x"], &[picture], &shape).err().unwrap();
    assert!(err.to_string().contains("aspect ratio is too extreme"), "{err}");
    let err = pipe.latent_shape(64, 80).unwrap_err().to_string();
    assert!(err.contains("80: expected a positive multiple of 32"), "{err}");
    let config = QwenImage21TransformerConfig { patch_size: 2, ..Default::default() };
    assert!(config.validate().unwrap_err().contains("patch_size 2 is not supported"));
    let vae = QwenImage21VaeConfig { patch_size: Some(2), ..Default::default() };
    assert!(vae.validate().unwrap_err().contains("patch_size 2 is not supported"));
}
