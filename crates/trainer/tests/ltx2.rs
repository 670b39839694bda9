//! LTX-2 text-to-video with sound through the unchanged trainer (CPU): the tiny pipeline of
//! `make-tiny ltx2` with 9-frame 64×64 clips and their sound as one joint latent. Every
//! algorithm's tiny recipe trains on it with its own rewards (the family's Flow-GRPO recipe scores
//! the frames and the sound), is on-policy before its first update, and resumes bit for bit.

mod common;

/// LTX-2's overrides on the algorithms' tiny recipes: its clip size, length and frame rate, and
/// no CFG (as the peers' LTX-2 rollouts).
const LTX2: [&str; 4] = [
    "model.resolution=64",
    "model.num_frames=9",
    "model.frame_rate=24",
    "rollout.guidance_scale=1.0",
];

#[test]
fn every_algorithm_trains_and_resumes_on_ltx2() {
    common::families::every_algorithm_trains_and_resumes(
        "ltx2",
        "flow_grpo_ltx2_tiny.yaml",
        &LTX2,
        "video_to_audio_attn.to_k.lora_B",
    );
}

/// Image-to-video with sound: the prompt rows name their first frame (`image`), whose latent
/// tokens every sample keeps; every algorithm trains on it, is on-policy at its first step (the
/// log-probs average over the generated video and audio tokens) and resumes bit for bit.
#[test]
fn every_algorithm_trains_and_resumes_on_ltx2_image_to_video() {
    let data = common::root().join("examples/prompts/ltx2_i2v_tiny.jsonl");
    let data = format!("data.train_files=[{}]", data.display());
    let extra: Vec<&str> = LTX2.iter().copied().chain([data.as_str()]).collect();
    common::families::every_algorithm_trains_and_resumes(
        "ltx2",
        "flow_grpo_ltx2_i2v_tiny.yaml",
        &extra,
        "video_to_audio_attn.to_k.lora_B",
    );
}
