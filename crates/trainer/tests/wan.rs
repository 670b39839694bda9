//! Wan text-to-video through the unchanged trainer (CPU): the tiny pipeline of `make-tiny wan`
//! (Wan2.2-TI2V layout) with 5-frame 32×32 clips. Every algorithm's tiny recipe trains and resumes
//! on it; the DanceGRPO tiny recipe resumes bit for bit and writes animated grids with one picture
//! per decoded frame. The two-expert layout (Wan2.2-T2V-A14B) trains both experts' LoRAs and
//! resumes bit for bit.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{assert_same_metrics, lora_moved, root, scratch, tensors};
use flowtune_config::Recipe;
use flowtune_models::wan::{second_expert_file, write_tiny_wan, TinyWanSpec};
use flowtune_trainer::train;
use tch::Device;

/// Wan's overrides on the algorithms' tiny recipes: 5 pixel frames, and an SDE window that starts
/// at step 1 (the grid's σ₀ = 1 − 1e-6 makes the Flow-GRPO SDE's std ~1000η there).
const WAN: [&str; 3] =
    ["model.num_frames=5", "rollout.sde_window_size=2", "rollout.sde_window_range=[1, 3]"];

#[test]
fn every_algorithm_trains_and_resumes_on_wan() {
    common::families::every_algorithm_trains_and_resumes(
        "wan",
        "flow_grpo_wan_tiny.yaml",
        &WAN,
        "attn2.to_k.lora_B",
    );
}

/// Wan2.2-TI2V image-to-video: the prompt rows name their first frame (`image`), which every
/// sample keeps; every algorithm trains on it, is on-policy at its first step (the log-probs
/// average over the generated frames) and resumes bit for bit.
#[test]
fn every_algorithm_trains_and_resumes_on_wan_image_to_video() {
    let data = root().join("examples/prompts/wan_i2v_tiny.jsonl");
    let data = format!("data.train_files=[{}]", data.display());
    let extra: Vec<&str> = WAN.iter().copied().chain([data.as_str()]).collect();
    common::families::every_algorithm_trains_and_resumes(
        "wan",
        "flow_grpo_wan_i2v_tiny.yaml",
        &extra,
        "attn2.to_k.lora_B",
    );
}

/// `file` (an example recipe) on `pipeline` with tiny prompts, `steps` steps written to `out`, a
/// checkpoint every step and `trainer.resume=resume`, then `extra` overrides.
fn tiny_run(
    file: &str,
    pipeline: &Path,
    out: &Path,
    steps: u64,
    resume: &str,
    extra: &[&str],
) -> Recipe {
    let mut overrides = vec![
        format!("model.path={}", pipeline.display()),
        format!("data.train_files=[{}]", root().join("examples/prompts/tiny.txt").display()),
        format!("trainer.output_dir={}", out.display()),
        format!("trainer.total_steps={steps}"),
        "trainer.save_freq=1".into(),
        format!("trainer.resume={resume}"),
    ];
    overrides.extend(extra.iter().map(|s| s.to_string()));
    Recipe::load(&root().join("examples").join(file), &overrides).expect("recipe")
}

fn dance(pipeline: &Path, out: &Path, steps: u64, resume: &str) -> Recipe {
    let extra = ["trainer.image_freq=2"];
    tiny_run("dance_grpo_wan_tiny.yaml", pipeline, out, steps, resume, &extra)
}

#[test]
fn dance_grpo_on_wan_resumes_bit_for_bit_and_writes_video_grids() {
    let pipeline = scratch("wan-dance-pipeline");
    (flowtune_models::family_named("wan").expect("built in").write_tiny)(&pipeline, 5)
        .expect("make-tiny wan");
    let straight = scratch("wan-dance-straight");
    let summary = train(&dance(&pipeline, &straight, 2, "none"), Device::Cpu).expect("train");
    assert!(summary.metrics[0].values().all(|v| v.is_finite()), "{:?}", summary.metrics[0]);
    let lora = tensors(&summary.export);
    assert!(lora_moved(&lora), "the LoRA trained");

    // The grid of step 2 (two columns of samples): each clip's 5 frames of 32 pixels side by side
    // in the PNG, one frame per cell in each picture of the GIF.
    let png = image::open(straight.join("images/train_step_000002.png")).expect("a PNG grid");
    assert!((2 * 5 * 32..3 * 5 * 32).contains(&png.width()), "{} pixels wide", png.width());
    let gif = std::fs::File::open(straight.join("images/train_step_000002.gif")).expect("a GIF");
    let decoder = image::codecs::gif::GifDecoder::new(std::io::BufReader::new(gif)).unwrap();
    let played = image::AnimationDecoder::into_frames(decoder).collect_frames().unwrap();
    assert_eq!(played.len(), 5, "one grid per decoded frame");
    let gif_width = played[0].buffer().width();
    assert!((2 * 32..2 * 5 * 32).contains(&gif_width), "GIF {gif_width} pixels wide");

    let resumed = scratch("wan-dance-resumed");
    train(&dance(&pipeline, &resumed, 1, "none"), Device::Cpu).expect("first step");
    let again = train(&dance(&pipeline, &resumed, 2, "auto"), Device::Cpu).expect("resumed");
    assert_eq!(again.steps_run, 1, "resumed from step 1");
    let after = tensors(&again.export);
    for (name, t) in &lora {
        assert!(t.equal(&after[name]), "{name} differs after resuming");
    }
    assert_same_metrics("", &summary.metrics[1], &again.metrics[0]);
}

fn a14b(pipeline: &Path, out: &Path, steps: u64, resume: &str) -> Recipe {
    tiny_run("flow_grpo_wan_a14b_tiny.yaml", pipeline, out, steps, resume, &[])
}

/// The exported LoRA of each expert: `pytorch_lora_weights.safetensors` (transformer) and
/// `pytorch_lora_weights_transformer_2.safetensors`, both with diffusers' `transformer.` keys.
fn expert_loras(export: &Path) -> [BTreeMap<String, tch::Tensor>; 2] {
    [export.to_path_buf(), second_expert_file(export)].map(|path| {
        let lora = tensors(&path);
        assert!(lora.keys().all(|k| k.starts_with("transformer.blocks.")), "{path:?}");
        lora
    })
}

#[test]
fn flow_grpo_on_wan_a14b_trains_both_experts_and_resumes_bit_for_bit() {
    let pipeline = scratch("wan-a14b-pipeline");
    let spec = TinyWanSpec { seed: 5, wan21: true, two_experts: true, ..Default::default() };
    write_tiny_wan(&pipeline, &spec).expect("make-tiny wan --a14b");
    let straight = scratch("wan-a14b-straight");
    let summary = train(&a14b(&pipeline, &straight, 2, "none"), Device::Cpu).expect("train");
    assert!(summary.metrics[0].values().all(|v| v.is_finite()), "{:?}", summary.metrics[0]);
    let loras = expert_loras(&summary.export);
    assert!(loras.iter().all(lora_moved), "both experts' LoRAs trained");
    assert!(!loras[0]["transformer.blocks.0.attn1.to_q.lora_B.weight"]
        .equal(&loras[1]["transformer.blocks.0.attn1.to_q.lora_B.weight"]));

    let resumed = scratch("wan-a14b-resumed");
    train(&a14b(&pipeline, &resumed, 1, "none"), Device::Cpu).expect("first step");
    let again = train(&a14b(&pipeline, &resumed, 2, "auto"), Device::Cpu).expect("resumed");
    assert_eq!(again.steps_run, 1, "resumed from step 1");
    for (want, got) in loras.iter().zip(expert_loras(&again.export)) {
        for (name, t) in want {
            assert!(t.equal(&got[name]), "{name} differs after resuming");
        }
    }
    assert_same_metrics("", &summary.metrics[1], &again.metrics[0]);
}
