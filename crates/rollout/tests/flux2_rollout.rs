//! FLUX.2 [klein] end to end against `scripts/reference_flux2.py`: the tiny pipeline of
//! `flowtune make-tiny flux2` loaded through the registry, and a whole ODE sampling run (4 Euler
//! steps from given latents, the pipeline's sigmas with its empirical μ, CFG 3 against the empty
//! prompt) equal to `Flux2KleinPipeline.__call__`'s final latents and pictures (within 2 levels);
//! with `is_distilled` the same call runs no CFG, and neither does flowtune; with two reference
//! images (`image=`) on every row, the negative prompt's included. FLUX.2 [dev] against
//! `scripts/reference_flux2_dev.py`: `Flux2Pipeline.__call__` with its guidance embedded (4, and 2.5
//! with two reference images), no CFG.

use flowtune_fixtures::{dir, tensors, Checker, MODEL_RTOL};
use flowtune_models::{FlowPipeline, PipelineOptions};
use flowtune_rollout::{encode_rows, sample_trajectory, Engine, Guidance, TrajectoryRequest};
use flowtune_sampling::SamplerConfig;
use tch::{Device, Kind, Tensor};

/// The script's `PROMPTS` and `SPEC`.
const PROMPTS: [&str; 2] = [
    "a red circle next to a blue square",
    "一只猫坐在垫子上, \"OPEN\" 24/7, with a long caption that runs past the sequence length of \
     the tiny pipeline so that this row is truncated",
];
const GUIDANCE: f64 = 3.0;

/// The final latents and u8 pictures of one ODE run of `pipe` on the fixture's latents, every
/// row conditioned on `references`.
fn ode_run(
    pipe: &dyn FlowPipeline,
    io: &std::collections::HashMap<String, Tensor>,
    references: &[image::RgbaImage],
) -> (Tensor, Tensor) {
    ode_run_sized(pipe, io, references, &PROMPTS, (32, 48))
}

/// [`ode_run`] of `prompts` at `size` (height, width).
fn ode_run_sized(
    pipe: &dyn FlowPipeline,
    io: &std::collections::HashMap<String, Tensor>,
    references: &[image::RgbaImage],
    prompts: &[&str; 2],
    (height, width): (i64, i64),
) -> (Tensor, Tensor) {
    let sampler = SamplerConfig { n: 1, steps: 4, guidance_scale: GUIDANCE, ..Default::default() };
    let shape = pipe.latent_shape(height, width).expect("the fixture's size");
    let engine = Engine::new(pipe, &sampler, shape.clone(), 0).expect("engine");
    let sets = if references.is_empty() { vec![] } else { vec![references.to_vec(); 2] };
    let text = encode_rows(pipe, prompts, &sets, &shape, None).expect("prompts");
    let negatives = [pipe.default_negative_prompt(); 2];
    let negative = encode_rows(pipe, &negatives, &sets, &shape, None).expect("negative");
    let request = TrajectoryRequest {
        grid: &engine.grid,
        text: &text,
        guidance: Guidance { scale: GUIDANCE, scale_2: None, negative: Some(&negative) },
        step: sampler.step_params(engine.grid.sigmas[1] as f64),
        windows: &[0..0, 0..0],
        initial: &io["input.initial_latents"],
    };
    // No SDE window: every step is Euler and the drawn noise unused.
    let noise = |_| io["input.initial_latents"].zeros_like();
    let out = tch::no_grad(|| sample_trajectory(pipe.denoiser(), &request, noise)).expect("ode");
    let pixels = tch::no_grad(|| pipe.decode_rgb8(&out.final_latents)).expect("decode");
    (out.final_latents, pixels)
}

/// The fixture's two reference pictures.
fn reference_pictures(io: &std::collections::HashMap<String, Tensor>) -> Vec<image::RgbaImage> {
    (0..2)
        .map(|i| {
            let t = &io[&format!("input.reference_{i}")];
            let (h, w) = (t.size()[0] as u32, t.size()[1] as u32);
            let bytes = Vec::<u8>::try_from(t.flatten(0, -1)).unwrap();
            image::DynamicImage::ImageRgb8(image::RgbImage::from_raw(w, h, bytes).unwrap())
                .to_rgba8()
        })
        .collect()
}

/// The largest difference in levels between u8 `pixels` and the pipeline's `np` pictures.
fn levels_off(pixels: &Tensor, images: &Tensor) -> i64 {
    let want = (images * 255.0).round().to_kind(Kind::Int);
    (pixels.to_kind(Kind::Int) - want).abs().max().int64_value(&[])
}

#[test]
fn flux2_ode_run_matches_the_pipeline_call() {
    let io = tensors("flux2_klein_pipeline_io.safetensors");
    let path = dir().join("flux2_klein_pipeline");
    let options =
        PipelineOptions { max_sequence_length: Some(48), ..PipelineOptions::new(Device::Cpu) };
    let pipe = flowtune_models::load_pipeline(&path, &options).expect("load the tiny pipeline");
    let mut check = Checker::new("flux2_klein_pipeline_io.safetensors");
    check.case();
    let grid = Engine::new(
        pipe.as_ref(),
        &SamplerConfig { n: 1, steps: 4, ..Default::default() },
        pipe.latent_shape(32, 48).unwrap(),
        0,
    )
    .expect("engine")
    .grid;
    let sigmas = Tensor::from_slice(&grid.sigmas);
    check.close_within("sigmas", &sigmas, &io["output.sigmas"], 1e-7);
    assert!(pipe.denoiser().runs_cfg(GUIDANCE), "a base [klein] runs CFG above 1");
    let (latents, pixels) = ode_run(pipe.as_ref(), &io, &[]);
    check.close_within("final_latents", &latents, &io["output.final_latents"], MODEL_RTOL);
    let off = levels_off(&pixels, &io["output.images"]);
    if off > 2 {
        check.fail(format!("pictures differ from the pipeline's by {off} levels"));
    }
    println!("ODE run: pictures within {off} levels of Flux2KleinPipeline.__call__");

    check.case();
    let references = reference_pictures(&io);
    let (latents, pixels) = ode_run(pipe.as_ref(), &io, &references);
    let want = &io["output.reference_final_latents"];
    check.close_within("reference final_latents", &latents, want, MODEL_RTOL);
    let off = levels_off(&pixels, &io["output.reference_images"]);
    if off > 2 {
        check.fail(format!("pictures with references differ from the pipeline's by {off} levels"));
    }
    println!("ODE run with reference images: pictures within {off} levels");

    check.case();
    let tmp = flowtune_fixtures::scratch("flux2-distilled");
    for entry in std::fs::read_dir(&path).unwrap() {
        let entry = entry.unwrap().path();
        let link = tmp.join(entry.file_name().unwrap());
        if entry.is_dir() && !link.exists() {
            std::os::unix::fs::symlink(&entry, &link).unwrap();
        }
    }
    let mut index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path.join("model_index.json")).unwrap())
            .unwrap();
    index["is_distilled"] = serde_json::json!(true);
    std::fs::write(tmp.join("model_index.json"), index.to_string()).unwrap();
    let distilled = flowtune_models::load_pipeline(&tmp, &options).expect("distilled");
    assert!(!distilled.denoiser().runs_cfg(GUIDANCE), "a distilled [klein] runs no CFG");
    let (latents, pixels) = ode_run(distilled.as_ref(), &io, &[]);
    let want = &io["output.distilled_final_latents"];
    check.close_within("distilled final_latents", &latents, want, MODEL_RTOL);
    let off = levels_off(&pixels, &io["output.distilled_images"]);
    if off > 2 {
        check.fail(format!("distilled pictures differ from the pipeline's by {off} levels"));
    }
    println!("distilled ODE run: pictures within {off} levels");
    check.finish();
}

#[test]
fn flux2_dev_ode_runs_match_the_pipeline_call() {
    let io = tensors("flux2_dev_pipeline_io.safetensors");
    let path = dir().join("flux2_dev_pipeline");
    let prompts = [
        "a red circle next to a blue square",
        "一只猫坐在垫子上, \"OPEN\" 24/7, with a long caption that runs past the sequence length \
         of the tiny pipeline so that this row is truncated before its end",
    ];
    let mut check = Checker::new("flux2_dev_pipeline_io.safetensors");
    for (key, guidance, references) in
        [("", 4.0, vec![]), ("reference_", 2.5, reference_pictures(&io))]
    {
        check.case();
        let options = PipelineOptions {
            max_sequence_length: Some(112),
            embedded_guidance: Some(guidance),
            ..PipelineOptions::new(Device::Cpu)
        };
        let pipe = flowtune_models::load_pipeline(&path, &options).expect("load the tiny [dev]");
        assert!(!pipe.denoiser().runs_cfg(GUIDANCE), "[dev] embeds its guidance, no CFG");
        let (latents, pixels) = ode_run_sized(pipe.as_ref(), &io, &references, &prompts, (48, 32));
        let want = &io[&format!("output.{key}final_latents")];
        check.close_within(&format!("{key}final_latents"), &latents, want, MODEL_RTOL);
        let off = levels_off(&pixels, &io[&format!("output.{key}images")]);
        if off > 2 {
            check.fail(format!("{key}pictures differ from Flux2Pipeline's by {off} levels"));
        }
        println!("[dev] {key}ODE run (guidance {guidance}): pictures within {off} levels");
    }
    check.finish();
}
