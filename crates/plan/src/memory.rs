//! What a rank holds during a training step, item by item (formulas in `docs/plan.md`).

use serde::Serialize;

use crate::denoisers::{Denoiser, Tokens};
use crate::inventory::Inventory;
use crate::{Dtype, Offload, Pipeline, Setup, Sharding, StateOffload};

/// Where an item lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Place {
    Device,
    Host,
}

/// When an item is held: the whole step, or only one of its two phases (rollout without
/// gradients, then the update), which never hold their activations at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Step,
    Rollout,
    Update,
}

/// One line of the plan.
#[derive(Debug, Clone, Serialize)]
pub struct Item {
    pub item: String,
    pub dtype: &'static str,
    pub bytes: u64,
    pub place: Place,
    pub phase: Phase,
}

/// A rank's memory in one training step.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub items: Vec<Item>,
    /// Parameters of the trained denoiser(s), and of the adapters (0 under full fine-tuning).
    pub denoiser_params: u64,
    pub lora_params: u64,
    /// Self-attention tokens per sequence (LTX-2: video tokens plus the audio tokens weighted by
    /// their width, h_a / h each), and sequences per micro-batch.
    pub tokens: u64,
    pub sequences: u64,
    pub device_bytes: u64,
    /// What the device holds while loading: every denoiser whole in `model.dtype`, or when its
    /// blocks are sharded its weights outside the blocks and this rank's slices (each rank reads
    /// only those from the files), with the encoders and VAE that stay on the device.
    pub load_bytes: u64,
    pub host_bytes: u64,
}

/// Values in the denoiser's dtype a forward without gradients holds at its peak, per token, hidden
/// unit and sequence of its batch: the largest a sequence added to a rollout's peak resident
/// memory, measured at real width on CPU (docs/plan.md, "Rollout activations").
pub const ROLLOUT_VALUES: f64 = 27.0;

/// Plans one rank of `setup` on `pipe`.
pub fn plan(pipe: &Pipeline, setup: &Setup) -> Plan {
    let mut items = vec![];
    let mut push = |item: String, dtype: Dtype, bytes: u64, place: Place| {
        items.push(Item { item, dtype: dtype.name(), bytes, place, phase: Phase::Step });
    };
    let d = setup.dtype.bytes();
    let n = setup.gpus.max(1);
    let mut params = 0;
    let mut lora = 0;
    // One process shards its blocks too when the slices live on the host; rollout ranks keep
    // whole weights and nothing of the update.
    let trains = !setup.samples_only;
    let shards = trains && (n > 1 || setup.state_offload == StateOffload::All);
    let frozen_shards = !setup.full && setup.sharding == Sharding::Frozen && shards;
    let full_shards = setup.full && setup.sharding == Sharding::Full && shards;
    // `trainer.offload`: the optimizer's state, then the block slices, on the host.
    let on_host = |off: bool| if off { Place::Host } else { Place::Device };
    let (state, slices_at) = (
        on_host(setup.state_offload >= StateOffload::Optimizer),
        on_host(setup.state_offload == StateOffload::All && (frozen_shards || full_shards)),
    );
    // Under full sharding: (block parameters, largest block) summed over the denoisers.
    let (mut sharded, mut largest_block) = (0, 0);
    for (name, den) in &pipe.denoisers {
        let p = den.inventory.params();
        params += p;
        if full_shards {
            let (blocks, largest) = block_params(&den.inventory);
            (sharded, largest_block) = (sharded + blocks, largest_block.max(largest));
            let f32 = Dtype::F32;
            let slices = format!("{name} block weights, f32 masters (1/{n})");
            push(slices, f32, blocks.div_ceil(n) * 4, slices_at);
            push(format!("{name} one block gathered"), setup.dtype, largest * d, Place::Device);
            push(format!("{name} other weights"), setup.dtype, (p - blocks) * d, Place::Device);
        } else if frozen_shards {
            let (blocks, largest) = block_params(&den.inventory);
            let dt = setup.dtype;
            push(format!("{name} block weights (1/{n})"), dt, blocks.div_ceil(n) * d, slices_at);
            push(format!("{name} one block gathered"), dt, largest * d, Place::Device);
            push(format!("{name} other weights"), dt, (p - blocks) * d, Place::Device);
        } else {
            push(format!("{name} weights"), setup.dtype, p * d, Place::Device);
        }
        if den.inventory.buffers > 0 {
            push(format!("{name} buffers"), setup.dtype, den.inventory.buffers * d, Place::Device);
        }
        if !setup.full {
            lora += den.inventory.lora_params(|m| setup.lora_rank_of(m));
        }
    }
    let frozen = setup.frozen_dtype;
    for t in &pipe.text_encoders {
        let place = on_host(setup.offload >= Offload::Encoders);
        push(format!("{} ({})", t.name, t.class), frozen, t.params * frozen.bytes(), place);
    }
    if let Some((v, _)) = &pipe.vae {
        let place = on_host(setup.offload == Offload::EncodersAndVae);
        push(format!("{} ({})", v.name, v.class), frozen, v.params * frozen.bytes(), place);
    }
    for a in &pipe.decoders {
        let place = on_host(setup.offload == Offload::EncodersAndVae);
        push(format!("{} ({})", a.name, a.class), frozen, a.params * frozen.bytes(), place);
    }
    let teachers = if trains { &setup.teachers[..] } else { &[] };
    for (i, teacher) in teachers.iter().enumerate() {
        for (name, den) in &teacher.denoisers {
            let bytes = (den.inventory.params() + den.inventory.buffers) * d;
            push(format!("teacher {i} {name} weights"), setup.dtype, bytes, Place::Device);
        }
        for t in &teacher.text_encoders {
            let place = on_host(setup.offload >= Offload::Encoders);
            push(format!("teacher {i} {}", t.name), frozen, t.params * frozen.bytes(), place);
        }
        let vae = teacher.vae.iter().map(|(v, _)| v);
        for v in vae.chain(&teacher.decoders) {
            let place = on_host(setup.offload == Offload::EncodersAndVae);
            push(format!("teacher {i} {}", v.name), frozen, v.params * frozen.bytes(), place);
        }
    }
    for judge in &setup.judges {
        push(
            format!("{} weights", judge.name),
            judge.dtype,
            judge.weight_bytes(),
            on_host(judge.offload),
        );
    }
    if !trains {
        // A rollout rank samples with the adapters it is handed; its weights are above.
        if !setup.full {
            push("LoRA adapters".into(), Dtype::F32, 4 * lora, Place::Device);
        }
    } else if full_shards {
        let (whole, share) = (params - sharded, sharded.div_ceil(n));
        let acc = if setup.exact_gradient_sum { 8 } else { 4 };
        push(format!("block gradient sums (1/{n})"), Dtype::F32, acc * share, slices_at);
        push("one block's gradients".into(), setup.dtype, largest_block * d, Place::Device);
        push("other gradients".into(), setup.dtype, whole * d, Place::Device);
        push(format!("Adam moments (blocks 1/{n})"), Dtype::F32, 8 * (share + whole), state);
        if setup.reference_copy {
            let bytes = (share + largest_block + whole) * d;
            push(format!("reference copy (blocks 1/{n})"), setup.dtype, bytes, Place::Device);
        }
        if setup.weight_copies > 0 {
            let bytes = setup.weight_copies * (4 * share + whole * d);
            push(
                format!("EMA / old-policy / lagged copies (blocks 1/{n})"),
                Dtype::F32,
                bytes,
                state,
            );
        }
    } else if setup.full {
        push("gradients".into(), setup.dtype, params * d, Place::Device);
        // ZeRO-1: each rank keeps masters and moments of about 1/N of the weights.
        let n = if setup.sharding == Sharding::Optimizer { n } else { 1 };
        let share = params.div_ceil(n);
        if setup.f32_master_weights && setup.dtype != Dtype::F32 {
            push(format!("f32 master weights (1/{n})"), Dtype::F32, 4 * share, state);
        }
        push(format!("Adam moments (1/{n})"), Dtype::F32, 8 * share, state);
        if setup.reference_copy {
            push("reference copy".into(), setup.dtype, params * d, Place::Device);
        }
        if setup.weight_copies > 0 {
            let bytes = setup.weight_copies * params * d;
            push("EMA / old-policy / lagged copies".into(), setup.dtype, bytes, state);
        }
    } else {
        push("LoRA adapters".into(), Dtype::F32, 4 * lora, Place::Device);
        push("LoRA gradients".into(), Dtype::F32, 4 * lora, Place::Device);
        push("Adam moments".into(), Dtype::F32, 8 * lora, state);
        if setup.weight_copies > 0 {
            let bytes = setup.weight_copies * 4 * lora;
            push("EMA / old-policy / lagged copies".into(), Dtype::F32, bytes, state);
        }
    }
    let den = pipe.denoiser();
    // LTX-2's audio tokens count at their width's share of the video tokens' (see `audio_tokens`).
    let audio = den.audio.map_or(0, |a| (audio_tokens(pipe, setup) * a.width).div_ceil(den.hidden));
    let condition = condition_tokens(pipe, setup);
    let (image, text) = (
        image_tokens(pipe, setup) + condition + audio,
        if den.joint_text { text_tokens(den, setup) } else { 0 },
    );
    // Sequence parallelism: a rank holds 1/S of every sequence's tokens.
    let s = setup.sequence_parallel.max(1);
    let (image, text) = (image.div_ceil(s), text.div_ceil(s));
    let tokens = image + text;
    // What the labels call the tokens: LTX-2's two streams by name, at their own counts.
    let seq = match den.audio {
        Some(_) => format!(
            "{} video + {} audio tokens",
            image_tokens(pipe, setup).div_ceil(s),
            audio_tokens(pipe, setup).div_ceil(s)
        ),
        None if condition > 0 => {
            format!("{tokens} tokens, {} of condition pictures", condition.div_ceil(s))
        }
        None => format!("{tokens} tokens"),
    };
    let sequences = setup.micro_batch * if setup.cfg { 2 } else { 1 };
    let samples = setup.samples();
    push(
        format!("trajectories ({samples} samples)"),
        Dtype::F32,
        samples * trajectory_bytes(pipe, setup),
        Place::Device,
    );
    // A split job's training ranks receive every share of the step whole, then keep their rows.
    if setup.rollout_ranks > 0 && trains {
        let whole = setup.prompts_per_step * setup.samples_per_prompt;
        items.push(Item {
            item: format!("handed-over trajectories ({whole} samples, while received)"),
            dtype: Dtype::F32.name(),
            bytes: whole * trajectory_bytes(pipe, setup),
            place: Place::Device,
            phase: Phase::Rollout,
        });
    }
    // Sharded blocks always recompute in backward.
    let checkpointed = setup.gradient_checkpointing || frozen_shards || full_shards;
    let act = activations(den, image, text, checkpointed, setup.dtype) * sequences as f64;
    let label = if checkpointed { "checkpointed" } else { "no checkpointing" };
    let branches = setup.rollout_rows() * if setup.cfg { 2 } else { 1 };
    let rollout = ROLLOUT_VALUES * (d * tokens * den.hidden * branches) as f64;
    let dtype = setup.dtype.name();
    if trains {
        items.push(Item {
            item: format!("activations ({sequences} seq × {seq}, {label})"),
            dtype,
            bytes: act as u64,
            place: Place::Device,
            phase: Phase::Update,
        });
    }
    items.push(Item {
        item: format!("rollout activations ({branches} seq × {seq}, no grad)"),
        dtype,
        bytes: rollout as u64,
        place: Place::Device,
        phase: Phase::Rollout,
    });
    // Scoring follows the rollout: a judge's cache, and its weights when they sleep on the host.
    for judge in &setup.judges {
        let mut scoring = |item: String, bytes: u64| {
            let dtype = judge.dtype.name();
            items.push(Item { item, dtype, bytes, place: Place::Device, phase: Phase::Rollout });
        };
        let (batch, tokens) = (judge.batch, judge.tokens);
        scoring(
            format!("{} key-value cache ({batch} × {tokens} tokens)", judge.name),
            judge.cache_bytes(),
        );
        if judge.offload {
            scoring(format!("{} weights while scoring", judge.name), judge.weight_bytes());
        }
    }
    let device = |phase| {
        let held = items.iter().filter(|i| i.place == Place::Device);
        held.filter(|i| i.phase == Phase::Step || i.phase == phase).map(|i| i.bytes).sum::<u64>()
    };
    let host = items.iter().filter(|i| i.place == Place::Host).map(|i| i.bytes).sum();
    let whole: u64 =
        pipe.denoisers.iter().map(|(_, den)| den.inventory.params() + den.inventory.buffers).sum();
    // Sharded: what the denoisers keep on the device between steps, read slice by slice.
    let kept: u64 = items
        .iter()
        .filter(|i| i.place == Place::Device && i.phase == Phase::Step)
        .filter(|i| {
            pipe.denoisers.iter().any(|(name, _)| i.item.starts_with(name.as_str()))
                || ["block gradient sums", "reference copy"].iter().any(|p| i.item.starts_with(p))
        })
        .filter(|i| !i.item.ends_with("one block gathered"))
        .map(|i| i.bytes)
        .sum();
    let loaded = if frozen_shards || full_shards { kept } else { whole * d };
    // Besides the denoisers: the encoders, VAE and teachers that live on the device.
    let frozen_on_device: u64 = items
        .iter()
        .filter(|i| i.place == Place::Device)
        .filter(|i| {
            i.item.starts_with("teacher ")
                || setup
                    .judges
                    .iter()
                    .any(|j| i.phase == Phase::Step && i.item.starts_with(&j.name))
                || pipe.text_encoders.iter().any(|t| i.item.starts_with(&t.name))
                || pipe.vae.as_ref().is_some_and(|(v, _)| i.item.starts_with(&v.name))
                || pipe.decoders.iter().any(|a| i.item.starts_with(&a.name))
        })
        .map(|i| i.bytes)
        .sum();
    Plan {
        device_bytes: device(Phase::Rollout).max(device(Phase::Update)),
        load_bytes: loaded + frozen_on_device,
        host_bytes: host,
        items,
        denoiser_params: params,
        lora_params: lora,
        tokens,
        sequences,
    }
}

/// Activation bytes of one sequence of `image` and `text` tokens in blocks of `dtype`
/// (large-models.md §2.2), each block over the tokens it sees (S): `Σ c·L·S·h` without
/// checkpointing; `Σ d·L·S·h + 1.5·c·S·h` with per-block checkpointing (block inputs kept in the
/// dtype's d bytes, the largest block recomputed).
pub fn activations(
    den: &Denoiser,
    image: u64,
    text: u64,
    checkpointing: bool,
    dtype: Dtype,
) -> f64 {
    let h = den.hidden as f64;
    let seen = |tokens: Tokens| {
        (match tokens {
            Tokens::All => image + text,
            Tokens::Image => image,
            Tokens::Text => text,
        }) as f64
    };
    let d = dtype.bytes() as f64;
    if checkpointing {
        let kept: f64 = den.blocks.iter().map(|&(l, _, t)| d * l as f64 * seen(t) * h).sum();
        let recomputed =
            den.blocks.iter().map(|&(_, c, t)| 1.5 * c.at(dtype) * seen(t) * h).fold(0.0, f64::max);
        kept + recomputed
    } else {
        den.blocks.iter().map(|&(l, c, t)| c.at(dtype) * l as f64 * seen(t) * h).sum()
    }
}

/// Latent grid of one sample: (frames, side) in latent pixels, and the VAE's channels.
fn latent_grid(pipe: &Pipeline, setup: &Setup) -> (u64, u64, u64) {
    let den = pipe.denoiser();
    let (spatial, temporal, channels) = pipe
        .vae
        .as_ref()
        .map_or((1, 1, den.in_channels), |(_, v)| (v.spatial, v.temporal, v.channels));
    let frames = match (den.joint_text, setup.num_frames) {
        // Wan: 81 frames unless the recipe says (diffusers' WanPipeline default); LTX-2: 121.
        (false, f) => (f.unwrap_or(default_frames(den)).saturating_sub(1)) / temporal + 1,
        (true, _) => 1,
    };
    (frames, setup.resolution / spatial, channels)
}

/// Pixel frames of a video sample the recipe leaves unset (the diffusers pipeline's default).
fn default_frames(den: &Denoiser) -> u64 {
    if den.audio.is_some() {
        121
    } else {
        81
    }
}

/// LTX-2's frame rate when the setup names none (its pipeline's default).
pub const LTX2_FRAME_RATE: f64 = 24.0;

/// Audio tokens of one LTX-2 sample: `round(frames / fps · per_second)` (half to even, as
/// LTX2Pipeline rounds), one per audio latent frame; 0 without an audio stream. In the block
/// formulas an audio token of width h_a weighs h_a / h of a video token: the block saves the
/// same bytes per token and unit of width in either stream (large-models.md §2.2's c), so
/// `c·(S_v·h + S_a·h_a) = c·(S_v + S_a·h_a/h)·h`.
pub fn audio_tokens(pipe: &Pipeline, setup: &Setup) -> u64 {
    let den = pipe.denoiser();
    let Some(a) = den.audio else { return 0 };
    let frames = setup.num_frames.unwrap_or(default_frames(den)) as f64;
    let fps = setup.frame_rate.unwrap_or(LTX2_FRAME_RATE);
    (frames / fps * a.per_second).round_ties_even() as u64
}

/// Image (or video) tokens of one sample: latent grid over the patch.
fn image_tokens(pipe: &Pipeline, setup: &Setup) -> u64 {
    let den = pipe.denoiser();
    let (frames, side, _) = latent_grid(pipe, setup);
    let side = side / den.patch;
    frames.div_ceil(den.temporal_patch) * side * side
}

/// Image-stream tokens of one sample's condition pictures: each encoded size's latent cells
/// over the patch.
fn condition_tokens(pipe: &Pipeline, setup: &Setup) -> u64 {
    let den = pipe.denoiser();
    let spatial = pipe.vae.as_ref().map_or(1, |(_, v)| v.spatial);
    let cell = spatial * den.patch;
    setup.condition_pictures.iter().map(|&(w, h)| (w / cell) * (h / cell)).sum()
}

/// Text tokens in the joint sequence: SD3 adds 77 CLIP tokens to the T5 ones, Z-Image pads the
/// caption to a multiple of 32, FLUX and Qwen-Image take `max_sequence_length`; condition
/// pictures' vision tokens add to it where the pipeline does not cut them there.
fn text_tokens(den: &Denoiser, setup: &Setup) -> u64 {
    setup.condition_text_tokens
        + match den.class.as_str() {
            "SD3Transformer2DModel" => 77 + setup.text_tokens,
            "ZImageTransformer2DModel" => setup.text_tokens.div_ceil(32) * 32,
            _ => setup.text_tokens,
        }
}

/// One sample's recorded trajectory: the latents entering and leaving each window step plus
/// the final latents (f32; LTX-2's joint video and audio latents), and its text states (and the negative prompt's under CFG).
fn trajectory_bytes(pipe: &Pipeline, setup: &Setup) -> u64 {
    let den = pipe.denoiser();
    let (frames, side, channels) = latent_grid(pipe, setup);
    let audio = den.audio.map_or(0, |a| audio_tokens(pipe, setup) * a.channels);
    let latents = (setup.window_steps + 2) * (frames * side * side * channels + audio) * 4;
    // The condition pictures' latents ride with the text states, in f32.
    let cell = den.patch * den.patch;
    let condition = condition_tokens(pipe, setup) * cell * channels * 4;
    let text = text_tokens(den, setup) * den.text_width * setup.frozen_dtype.bytes();
    latents + condition + text * if setup.cfg { 2 } else { 1 }
}

/// The block lists of the module trees the families build (what `trainer.sharding: frozen`
/// shards).
const BLOCK_LISTS: [&str; 6] = [
    "transformer_blocks",
    "single_transformer_blocks",
    "blocks",
    "layers",
    "noise_refiner",
    "context_refiner",
];

/// Linear-layer parameters inside blocks, and those of the largest block (norm scales inside
/// blocks, under 0.1 % of them, count as other weights).
fn block_params(inv: &Inventory) -> (u64, u64) {
    let mut lists: Vec<(&str, u64, u64)> = vec![];
    for l in &inv.linears {
        let list = l.name.split('.').next().unwrap_or_default();
        if !BLOCK_LISTS.contains(&list) {
            continue;
        }
        let params = l.count * l.fan_in * l.fan_out;
        match lists.iter_mut().find(|(name, ..)| *name == list) {
            Some(e) => (e.1, e.2) = (e.1 + params, e.2.max(l.count)),
            None => lists.push((list, params, l.count)),
        }
    }
    let total = lists.iter().map(|e| e.1).sum();
    let largest = lists.iter().map(|e| e.1.div_ceil(e.2.max(1))).max().unwrap_or(0);
    (total, largest)
}
