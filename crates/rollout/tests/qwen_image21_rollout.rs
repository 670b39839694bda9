//! Qwen-Image 2.1 end to end against `scripts/reference_qwen_image21.py`: the tiny
//! `QwenImage21Pipeline` saved by diffusers, its prompt encoding (`encode_prompt` of prompts of
//! different lengths and of the empty prompt), the author-set sigma grid, and a whole ODE sampling
//! run (4 Euler steps from given latents, CFG 4 against the empty prompt) equal to `__call__`'s
//! final latents and pictures (within 2 levels).

use flowtune_fixtures::{dir, tensors, Checker, MODEL_RTOL};
use flowtune_models::qwen_image21::QwenImage21Pipeline;
use flowtune_models::{FlowPipeline, PipelineOptions};
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
    let path = dir().join("qwen_image21_pipeline");
    QwenImage21Pipeline::load(&path, &PipelineOptions::new(Device::Cpu)).expect("load")
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

#[test]
fn ode_run_matches_the_pipeline_call() {
    let io = tensors("qwen_image21_pipeline_io.safetensors");
    let pipe = pipeline();
    let mut check = Checker::new("qwen_image21_pipeline_io.safetensors ODE run");
    check.case();
    let sampler =
        SamplerConfig { n: 1, steps: STEPS, guidance_scale: GUIDANCE, ..Default::default() };
    let shape = pipe.latent_shape(64, 96).expect("64 × 96");
    let engine = Engine::new(&pipe, &sampler, shape.clone(), 0).expect("engine");
    let sigmas = Tensor::from_slice(&engine.grid.sigmas);
    assert!(sigmas.equal(&io["output.sigmas"]), "{sigmas:?} vs the pipeline's");
    // Another step count than the author's sigmas samples on linspace(1, 1/N, N), shifted.
    let six = SamplerConfig { steps: 6, ..sampler.clone() };
    let grid = Engine::new(&pipe, &six, shape.clone(), 0).expect("engine").grid;
    assert_eq!((grid.sigmas.len(), grid.sigmas[0]), (7, 1.0), "{:?}", grid.sigmas);
    let text = encode_rows(&pipe, &PROMPTS, &[], &shape, None).expect("prompts");
    let negatives = [pipe.default_negative_prompt(); 2];
    let negative = encode_rows(&pipe, &negatives, &[], &shape, None).expect("negative");
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
    check.close_within(
        "final_latents",
        &out.final_latents,
        &io["output.final_latents"],
        MODEL_RTOL,
    );
    let pixels = tch::no_grad(|| pipe.decode_rgb8(&out.final_latents)).expect("decode");
    let want = (io["output.images"].narrow(3, 0, 3) * 255.0).round().to_kind(Kind::Int);
    let off = (pixels.to_kind(Kind::Int) - want).abs().max().int64_value(&[]);
    if off > 2 {
        check.fail(format!("pictures differ from the pipeline's by {off} levels"));
    }
    println!("ODE run: pictures within {off} levels of QwenImage21Pipeline.__call__");
    check.finish();
}

/// What flowtune does not run is refused by name: condition images (Qwen3-VL's vision tower), a
/// patchifying transformer or VAE; picture sides that are not multiples of 32.
#[test]
fn unsupported_parts_are_refused_by_name() {
    use flowtune_models::qwen_image21::{QwenImage21TransformerConfig, QwenImage21VaeConfig};

    let pipe = pipeline();
    let picture = image::RgbImage::new(64, 64);
    let shape = pipe.latent_shape(64, 64).unwrap();
    let err = pipe.encode_prompts_with_pictures(&["x"], &[picture], &shape).err().unwrap();
    assert!(err.to_string().contains("condition images (image=) are not supported"), "{err}");
    let err = pipe.latent_shape(64, 80).unwrap_err().to_string();
    assert!(err.contains("80: expected a positive multiple of 32"), "{err}");
    let config = QwenImage21TransformerConfig { patch_size: 2, ..Default::default() };
    assert!(config.validate().unwrap_err().contains("patch_size 2 is not supported"));
    let vae = QwenImage21VaeConfig { patch_size: Some(2), ..Default::default() };
    assert!(vae.validate().unwrap_err().contains("patch_size 2 is not supported"));
}
