//! Every algorithm on a tiny random Qwen-Image pipeline (CPU) through the unchanged trainer: each
//! `examples/*_tiny.yaml` pointed at `make-tiny qwen-image` with Qwen-Image's LoRA targets trains,
//! is on-policy before its first update (ratio 1, rollout ↔ replay log-prob drift 0), and resumes
//! to the same adapters and metrics.

mod common;

use common::{lora_moved, scratch, tensors};
use flowtune_trainer::train;
use tch::Device;

#[test]
fn every_algorithm_trains_and_resumes_on_qwen_image() {
    common::families::every_algorithm_trains_and_resumes(
        "qwen_image",
        "flow_grpo_qwen_image_tiny.yaml",
        &[],
        "img_mlp.net.0.proj.lora_B",
    );
}

/// Qwen-Image-Edit-Plus through the trainer: prompt rows carry condition pictures (`images`, or
/// `extra_info.image`), which reach the text encoder's vision tower and the image stream; the run
/// is on-policy at its first step and trains.
#[test]
fn edit_plus_trains_on_rows_with_condition_pictures() {
    use flowtune_models::qwen_image::{write_tiny_qwen_image, TinyQwenImageSpec};
    let dir = scratch("qwen-edit");
    let model = dir.join("pipeline");
    let spec = TinyQwenImageSpec { seed: 4, edit: true, zero_cond_t: true, ..Default::default() };
    write_tiny_qwen_image(&model, &spec).expect("make-tiny qwen-image --edit");
    let prompts = common::families::picture_rows(&dir);
    let recipe = common::families::picture_recipe(
        "flow_grpo_qwen_image_tiny.yaml",
        &model,
        &prompts,
        (&dir.join("run"), 1, "none"),
    );
    // One step (a whole step costs minutes on CPU: diffusers VAE-encodes condition pictures at
    // about 1024², 4056 tokens each here); resuming is the plain pipeline's test above.
    let run = train(&recipe, Device::Cpu).expect("train");
    let first = &run.metrics[0];
    assert!(first.values().all(|v| v.is_finite()), "{first:?}");
    assert!((first["actor/ratio_mean"] - 1.0).abs() <= 1e-6, "on-policy: {first:?}");
    assert!(first["rollout_corr/logprob_abs_diff_max"] <= 1e-5, "{first:?}");
    assert!(lora_moved(&tensors(&run.export)), "the LoRA trained");
}

/// The throughput paths change no training: with attention without padding (two prompts of
/// different lengths share each rollout batch) and fused projections on, as by default, every
/// metric of 3 steps (smooth reward) is within 1e-5 of the run with both off, and so are the
/// adapters; fused GEMMs ran.
#[test]
fn throughput_paths_train_as_without_them() {
    let pipeline = scratch("qwen-fast-pipeline");
    (flowtune_models::family_named("qwen_image").unwrap().write_tiny)(&pipeline, 5).unwrap();
    let run = |name: &str, on: bool| {
        let out = scratch(name);
        let overrides = [
            format!("model.path={}", pipeline.display()),
            format!(
                "data.train_files=[{}]",
                common::root().join("examples/prompts/tiny.txt").display()
            ),
            format!("trainer.output_dir={}", out.display()),
            "trainer.total_steps=3".into(),
            "reward.functions=[{name: brightness}]".into(),
            format!("model.unpadded_attention={on}"),
            format!("model.fused_projections={on}"),
        ];
        let file = common::root().join("examples/flow_grpo_qwen_image_tiny.yaml");
        let recipe = flowtune_config::Recipe::load(&file, &overrides).expect("recipe");
        let summary = train(&recipe, Device::Cpu).expect("train");
        (summary.metrics, tensors(&summary.export))
    };
    let fused = flowtune_models::nn::fused_gemms();
    let (fast, fast_lora) = run("qwen-fast-on", true);
    assert!(flowtune_models::nn::fused_gemms() > fused, "fused GEMMs ran");
    let (plain, plain_lora) = run("qwen-fast-off", false);
    assert_eq!(fast.len(), 3);
    for (step, (a, b)) in plain.iter().zip(&fast).enumerate() {
        for (key, x) in
            a.iter().filter(|(k, _)| !k.starts_with("perf/") && !k.starts_with("timing"))
        {
            let y = b[key];
            assert!(
                (x - y).abs() <= 1e-5 * x.abs().max(1.0),
                "step {}: {key}: {x} vs {y}",
                step + 1
            );
        }
    }
    assert!(lora_moved(&fast_lora));
    // Adam normalises each element's step, so rounding in a near-zero gradient moves that
    // element by up to the learning rate: the adapters are compared as a whole.
    let norm = |t: &tch::Tensor| t.norm().double_value(&[]);
    let (mut diff, mut size) = (0.0, 0.0);
    for (key, t) in &plain_lora {
        diff += norm(&(t - &fast_lora[key])).powi(2);
        size += norm(t).powi(2);
    }
    let relative = (diff / size).sqrt();
    assert!(relative <= 1e-5, "adapters differ by {relative:e} of their norm");
}

/// The tiny Qwen-Image recipe trains against an in-process judge (a tiny random Qwen2.5-VL of
/// `scripts/reference_vlm_judge.py`, scoring by the probabilities of "1"…"5"): the judge's score
/// is the reward, it tells the samples apart, and the LoRA trains.
#[test]
fn trains_against_a_native_vlm_judge() {
    let pipeline = scratch("qwen-judge-pipeline");
    (flowtune_models::family_named("qwen_image").unwrap().write_tiny)(&pipeline, 5).unwrap();
    let out = scratch("qwen-judge-run");
    let judge = flowtune_fixtures::dir().join("vlm_qwen25_tiny");
    let overrides = [
        format!("model.path={}", pipeline.display()),
        format!("data.train_files=[{}]", common::root().join("examples/prompts/tiny.txt").display()),
        format!("trainer.output_dir={}", out.display()),
        "trainer.total_steps=2".into(),
        format!(
            "reward.functions=[{{name: vlm_judge, vlm: {{backend: native, model: {}, mode: \
             expectation, device: cpu, user_prompt: 'Rate the picture from 1 to 5 for: {{prompt}}', \
             score_tokens: {{'1': 1, '2': 2, '3': 3, '4': 4, '5': 5}}}}}}]",
            judge.display()
        ),
    ];
    let file = common::root().join("examples/flow_grpo_qwen_image_tiny.yaml");
    let recipe = flowtune_config::Recipe::load(&file, &overrides).expect("recipe");
    let run = train(&recipe, Device::Cpu).expect("train");
    assert_eq!(run.metrics.len(), 2);
    for step in &run.metrics {
        let score = step["critic/vlm_judge/mean"];
        assert!((0.0..=1.0).contains(&score), "the judge's score in [0, 1]: {score}");
        assert!(step["critic/vlm_judge/score_token_mass/mean"] > 0.0, "{step:?}");
        let spread = step["critic/rewards/max"] - step["critic/rewards/min"];
        assert!(spread > 0.0, "the judge tells samples apart: {step:?}");
    }
    assert!(lora_moved(&tensors(&run.export)), "the LoRA trained");
}
