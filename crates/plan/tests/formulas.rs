//! The memory formulas against large-models.md §2.2–2.3.

use std::path::PathBuf;

use flowtune_plan::memory::activations;
use flowtune_plan::{
    plan, verdict, Dtype, Offload, Patterns, Pipeline, Setup, Sharding, StateOffload, GIB,
};

fn read(name: &str) -> Pipeline {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/models").join(name);
    Pipeline::read(&dir).unwrap()
}

fn gib(bytes: f64) -> f64 {
    (bytes / GIB * 100.0).round() / 100.0
}

/// Activations per sequence (§2.2 table, 512² and Wan-5B 480p×81): checkpointed / not.
#[test]
fn activations_per_sequence() {
    let qwen = read("qwen-image");
    assert_eq!(gib(activations(qwen.denoiser(), 1024, 256, true, Dtype::Bf16)), 0.75);
    assert_eq!(gib(activations(qwen.denoiser(), 1024, 256, false, Dtype::Bf16)), 12.37);
    // The note counts all 34 Z-Image blocks over 1536 tokens (1.15 / 17.59); its refiners see one
    // stream each (2 × 1024 image, 2 × 512 text tokens).
    let z = read("z-image-turbo");
    assert_eq!(gib(activations(z.denoiser(), 1024, 512, true, Dtype::Bf16)), 1.13);
    assert_eq!(gib(activations(z.denoiser(), 1024, 512, false, Dtype::Bf16)), 16.56);
    let wan = read("wan2.2-ti2v-5b");
    assert_eq!(gib(activations(wan.denoiser(), 8190, 0, true, Dtype::Bf16)), 4.54);
    assert_eq!(gib(activations(wan.denoiser(), 8190, 0, false, Dtype::Bf16)), 62.77);
}

/// An f32 block saves its measured f32 bytes (1.4–1.7× the bf16 ones: diffusers computes norms
/// and modulations in f32 either way), and checkpointing keeps its f32 inputs (twice bf16's).
#[test]
fn f32_blocks_save_their_measured_bytes() {
    let z = read("z-image-turbo");
    let (image, text) = (1024, 512);
    let no_ckpt = |dtype| activations(z.denoiser(), image, text, false, dtype);
    let ratio = no_ckpt(Dtype::F32) / no_ckpt(Dtype::Bf16);
    assert!((ratio - 130.8 / 94.2).abs() < 1e-9, "{ratio}");
    let qwen = read("qwen-image");
    let (h, s) = (3072.0, 1280.0);
    let ckpt = |dtype: Dtype| activations(qwen.denoiser(), 1024, 256, true, dtype);
    let want = |d: f64, c: f64| d * 60.0 * s * h + 1.5 * c * s * h;
    assert!((ckpt(Dtype::Bf16) - want(2.0, 56.3)).abs() < 1.0);
    assert!((ckpt(Dtype::F32) - want(4.0, 96.4)).abs() < 1.0);
}

fn setup(full: bool, gpus: u64) -> Setup {
    Setup {
        full,
        dtype: Dtype::Bf16,
        frozen_dtype: Dtype::Bf16,
        lora_rank: 64,
        lora_targets: vec!["to_q".into()],
        lora_rank_pattern: Patterns::default(),
        offload: Offload::EncodersAndVae,
        resolution: 512,
        num_frames: None,
        frame_rate: None,
        text_tokens: 256,
        condition_pictures: vec![],
        condition_text_tokens: 0,
        micro_batch: 1,
        rollout_batch: 16,
        gradient_checkpointing: true,
        f32_master_weights: true,
        cfg: true,
        reference_copy: false,
        weight_copies: 0,
        prompts_per_step: 0,
        samples_per_prompt: 16,
        window_steps: 2,
        gpus,
        gpu_memory_gib: 80.0,
        sequence_parallel: 1,
        sharding: if full { Sharding::Optimizer } else { Sharding::None },
        exact_gradient_sum: false,
        state_offload: StateOffload::None,
        teachers: vec![],
        judges: vec![],
        rollout_ranks: 0,
        samples_only: false,
    }
}

/// Device bytes of the items whose name starts with `prefix`.
fn bytes(p: &flowtune_plan::Plan, prefix: &str) -> u64 {
    let on_device = |i: &&flowtune_plan::Item| i.place == flowtune_plan::Place::Device;
    p.items.iter().filter(on_device).filter(|i| i.item.starts_with(prefix)).map(|i| i.bytes).sum()
}

/// LoRA: 16 B per adapter parameter; full fine-tuning under ZeRO-1: 2P + 2P + 12P/N.
#[test]
fn optimizer_state_per_rank() {
    let qwen = read("qwen-image");
    let p = plan(&qwen, &setup(false, 1));
    let lora = p.lora_params;
    assert_eq!(lora, 60 * 64 * 2 * 3072);
    let state = bytes(&p, "LoRA adapters") + bytes(&p, "LoRA gradients") + bytes(&p, "Adam");
    assert_eq!(state, 16 * lora);
    // `rank_pattern` ranks: block 7's to_q at r = 8, blocks 10–19 at r = 128 (PEFT's rule).
    let mut patterned = setup(false, 1);
    let keys = [("transformer_blocks.7.attn.to_q", 8), (r"transformer_blocks\.1\d\..*", 128)];
    patterned.lora_rank_pattern = Patterns::new(keys).unwrap();
    assert_eq!(plan(&qwen, &patterned).lora_params, (49 * 64 + 8 + 10 * 128) * 2 * 3072);
    let params = 20_430_401_088u64;
    let p = plan(&qwen, &setup(true, 8));
    let sharded = bytes(&p, "f32 master") + bytes(&p, "Adam");
    assert_eq!(sharded, 12 * params.div_ceil(8));
    assert_eq!(bytes(&p, "gradients") + bytes(&p, "transformer weights"), 4 * params);
    assert_eq!(bytes(&p, "text_encoder") + bytes(&p, "vae"), 0, "offloaded: host only");
    assert_eq!(p.host_bytes, 2 * (8_292_166_656 + 126_892_531));
}

/// The verdict's search: full fine-tuning that ZeRO-1 cannot fit (4P of weights and gradients on
/// every rank) fits fully sharded, on more GPUs if need be; past what sharding can do, the
/// verdict says what is missing.
#[test]
fn verdict_search() {
    let sd35 = read("sd3.5-medium");
    let mut s = setup(true, 1);
    s.gpu_memory_gib = 24.0;
    let v = verdict(&sd35, &s);
    assert!(!v.fits && v.changes.iter().any(|c| c.starts_with("--gpus ")), "{v:?}");
    let qwen = read("qwen-image");
    let v = verdict(&qwen, &setup(true, 8));
    assert_eq!(v.changes, ["trainer.sharding=full"], "{v:?}");
    assert!(!v.fits && (40.0..43.0).contains(&v.changed_gib.unwrap()), "{v:?}");
    let mut tiny_gpu = setup(true, 8);
    tiny_gpu.gpu_memory_gib = 1.0;
    let v = verdict(&qwen, &tiny_gpu);
    assert!(!v.fits && v.changes.is_empty() && v.message.contains("on the host"), "{v:?}");
    // Frozen LoRA weights sharded over 8 GPUs, their slices and the Adam moments on the host.
    let mut lora = setup(false, 8);
    lora.sharding = Sharding::Frozen;
    lora.state_offload = StateOffload::All;
    lora.prompts_per_step = 8;
    let p = plan(&qwen, &lora);
    let host = |prefix: &str| {
        let items = p.items.iter().filter(|i| i.item.starts_with(prefix));
        items.map(|i| (i.place == flowtune_plan::Place::Host, i.bytes)).collect::<Vec<_>>()
    };
    let slices = host("transformer block weights (1/8)");
    assert!(slices.len() == 1 && slices[0].0 && slices[0].1 > 0, "{slices:?}");
    assert!(host("Adam moments").iter().all(|(on_host, _)| *on_host));
    assert!(host("LoRA adapters").iter().all(|(on_host, _)| !on_host));
    // A rollout of 16 rows under CFG holds more than a checkpointed micro-batch: the larger
    // phase is what the device total counts.
    let phase = |prefix: &str| p.items.iter().find(|i| i.item.starts_with(prefix)).unwrap().bytes;
    let (update, rollout) = (phase("activations"), phase("rollout activations"));
    assert!(rollout > update, "{rollout} vs {update}");
    let held: u64 = p
        .items
        .iter()
        .filter(|i| i.place == flowtune_plan::Place::Device && !i.item.starts_with("activations"))
        .map(|i| i.bytes)
        .sum();
    assert_eq!(p.device_bytes, held);
    // Sharded, a rank reads only its slices of the blocks (here into host memory): the device
    // loads the weights outside the blocks, never the whole model.
    let mut alone = setup(true, 1);
    (alone.sharding, alone.state_offload) = (Sharding::Full, StateOffload::All);
    let p = plan(&qwen, &alone);
    let others: u64 =
        p.items.iter().filter(|i| i.item.ends_with("other weights")).map(|i| i.bytes).sum();
    assert_eq!(p.load_bytes, others, "bf16 weights outside the blocks; the rest on the host");
    assert!(p.load_bytes < 2 * 20_430_401_088 / 100, "{}", p.load_bytes);
    // Unsharded, it loads them whole.
    alone.sharding = Sharding::None;
    assert!(plan(&qwen, &alone).load_bytes >= 2 * 20_430_401_088);
}

/// Sequence parallelism: a rank holds 1/S of every sequence's tokens, so the activations of
/// training and of the rollout divide by S; the samples a rank holds are its group's.
#[test]
fn sequence_parallel_divides_tokens_and_activations() {
    let wan = read("wan2.2-t2v-a14b");
    let mut s = setup(false, 8);
    (s.num_frames, s.resolution, s.prompts_per_step) = (Some(81), 480, 8);
    let one = plan(&wan, &s);
    s.sequence_parallel = 4;
    let four = plan(&wan, &s);
    assert_eq!(one.tokens, 21 * 30 * 30);
    assert_eq!(four.tokens, one.tokens / 4);
    for item in ["activations", "rollout activations"] {
        let (a, b) = (bytes(&one, item) as f64, bytes(&four, item) as f64);
        assert!((a / 4.0 - b).abs() <= 1e-6 * a, "{item}: {a} / 4 vs {b}");
    }
    // 8 prompts over 2 groups of 4 ranks, not over 8 ranks.
    assert_eq!(bytes(&four, "trajectories"), 4 * bytes(&one, "trajectories"));
}

/// LTX-2.3 at 512² × 121 frames: 16 latent frames of 16 × 16 video tokens, round(121 / 24 · 25)
/// = 126 audio tokens, each counted at 2048 / 4096 of a video token; the trajectory stores the
/// joint latent (128 channels per video and per audio token) and both streams' text states;
/// the connectors, audio VAE and vocoder are frozen beside the text encoder and VAE.
#[test]
fn ltx2_tokens_trajectories_and_frozen_parts() {
    let ltx = read("ltx-2.3");
    let mut s = setup(false, 1);
    (s.num_frames, s.text_tokens, s.cfg, s.prompts_per_step) = (Some(121), 1024, false, 1);
    let p = plan(&ltx, &s);
    assert_eq!(flowtune_plan::memory::audio_tokens(&ltx, &s), 126);
    assert_eq!(p.tokens, 16 * 16 * 16 + 63);
    let per_sample = 4 * (4096 + 126) * 128 * 4 + 1024 * (4096 + 2048) * 2;
    assert_eq!(bytes(&p, "trajectories"), 16 * per_sample);
    let frozen = 11_766_034_176 + 3_172_227_584 + 726_105_969 + 53_248_146 + 128_537_448;
    assert_eq!(p.host_bytes, 2 * frozen, "all five frozen parts offloaded");
    s.offload = Offload::None;
    let p = plan(&ltx, &s);
    for part in ["text_encoder", "connectors", "vae", "audio_vae", "vocoder"] {
        assert!(bytes(&p, part) > 0, "{part} on the device");
    }
    assert_eq!(p.load_bytes, 2 * (18_988_838_144 + frozen));
    // Activations: the joint block's c over S_v·h + S_a·h_a, checkpointed per block.
    let (h, seq) = (4096.0, 4159.0);
    let c = flowtune_plan::denoisers::c::LTX2.bf16;
    let want = 2.0 * 48.0 * seq * h + 1.5 * c * seq * h;
    assert!((activations(ltx.denoiser(), 4159, 0, true, Dtype::Bf16) - want).abs() < 1.0);
}
