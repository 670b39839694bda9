//! Denoiser transformers from their `config.json`: every linear layer and the other parameters,
//! laid out as diffusers 0.42.1 builds the class (`src/diffusers/models/transformers/`), and the
//! block structure the activation formula needs.

use crate::inventory::Inventory;
use crate::json::Json;
use crate::PlanError;

/// What the activation and trajectory formulas need from a denoiser.
/// The tokens a block runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokens {
    /// The whole sequence: image tokens, and the text tokens where text joins it.
    All,
    /// Image tokens only (Z-Image's noise refiner).
    Image,
    /// Text tokens only (Z-Image's context refiner).
    Text,
}

#[derive(Debug, Clone)]
pub struct Denoiser {
    pub class: String,
    pub inventory: Inventory,
    /// Hidden width h (heads × head_dim).
    pub hidden: u64,
    /// Blocks by kind: (how many, c = bytes saved per token per hidden unit, large-models.md §2.2,
    /// which tokens they see).
    pub blocks: Vec<(u64, Saved, Tokens)>,
    /// Pixels per token side: VAE factor × patch is applied by the caller; this is the patch.
    pub patch: u64,
    /// Latent frames per token (Wan's temporal patch); 1 for images.
    pub temporal_patch: u64,
    /// Whether text tokens join the self-attention sequence (MMDiT, single stream) or enter by
    /// cross-attention (Wan).
    pub joint_text: bool,
    /// Width of the text states the denoiser reads (what a trajectory stores per text token).
    pub text_width: u64,
    /// Latent channels the denoiser reads per pixel of the latent grid (before patching).
    pub in_channels: u64,
    /// Attention heads: `trainer.sequence_parallel_size` must divide them.
    pub heads: u64,
    /// LTX-2's second token stream: audio tokens beside the video ones.
    pub audio: Option<AudioStream>,
}

/// An audio token stream running through the same blocks as the video tokens (LTX-2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AudioStream {
    /// Hidden width of the audio tokens.
    pub width: u64,
    /// Latent channels per audio token (what a trajectory stores).
    pub channels: u64,
    /// Audio tokens per second of clip (`sampling_rate / hop_length / scale_factor`).
    pub per_second: f64,
}

/// Bytes one block saves for backward per token and hidden unit (c of large-models.md §2.2), by
/// the dtype the block runs in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Saved {
    /// The block's name in measured constant files (`qwen_image`).
    pub name: &'static str,
    pub bf16: f64,
    pub f32: f64,
}

impl Saved {
    /// c for a block in `dtype` (f16 saves as bf16 does).
    pub fn at(self, dtype: crate::Dtype) -> f64 {
        match dtype {
            crate::Dtype::F32 => self.f32,
            crate::Dtype::Bf16 | crate::Dtype::F16 => self.bf16,
        }
    }
}

/// Measured constants c: bf16 from large-models.md §2.2; f32 measured the same way by
/// `scripts/measure_activation_constants.py` (diffusers keeps its norms and modulations in f32
/// in both, so an f32 block saves 1.4–1.7×, not 2×, its bf16 bytes).
pub mod c {
    use super::Saved;

    pub const SD3_DUAL: Saved = Saved { name: "sd3_dual", bf16: 82.1, f32: 132.7 };
    pub const SD3_PLAIN: Saved = Saved { name: "sd3_plain", bf16: 58.3, f32: 100.5 };
    pub const FLUX_DOUBLE: Saved = Saved { name: "flux_double", bf16: 56.2, f32: 96.3 };
    pub const FLUX_SINGLE: Saved = Saved { name: "flux_single", bf16: 50.1, f32: 84.2 };
    pub const QWEN_IMAGE: Saved = Saved { name: "qwen_image", bf16: 56.3, f32: 96.4 };
    pub const Z_IMAGE: Saved = Saved { name: "z_image", bf16: 94.2, f32: 130.8 };
    pub const WAN_A14B: Saved = Saved { name: "wan_a14b", bf16: 81.4, f32: 113.9 };
    pub const WAN_5B: Saved = Saved { name: "wan_5b", bf16: 89.3, f32: 129.6 };
    /// LTX-2's joint block over S_v·h + S_a·h_a (`scripts/measure_ltx2_activation_constant.py`,
    /// LTX-2.3 flags, CPU, 2048 video and 64 audio tokens: the streams' real weight ratio). Per
    /// stream: video 125.9 / 181.3, audio 140.5 / 200.7 (Wan-5B measures 90.0 / 129.6 the
    /// same way).
    pub const LTX2: Saved = Saved { name: "ltx2", bf16: 126.2, f32: 181.6 };
}

/// Reads the denoiser whose config is `cfg`, by its `_class_name`.
pub fn denoiser(cfg: &Json) -> Result<Denoiser, PlanError> {
    let class = cfg.class().unwrap_or_default();
    // The families' defaults, as their parsers read them.
    let heads = match class.as_str() {
        "ZImageTransformer2DModel" => cfg.int("n_heads", Some(30))?,
        "SD3Transformer2DModel" => cfg.int("num_attention_heads", Some(18))?,
        "WanTransformer3DModel" => cfg.int("num_attention_heads", Some(40))?,
        "Flux2Transformer2DModel" => cfg.int("num_attention_heads", Some(48))?,
        // S must divide both streams' heads: their greatest common divisor.
        "LTX2VideoTransformer3DModel" => {
            let (mut a, mut b) = (
                cfg.int("num_attention_heads", Some(32))?,
                cfg.int("audio_num_attention_heads", Some(32))?,
            );
            while b != 0 {
                (a, b) = (b, a % b);
            }
            a
        }
        _ => cfg.int("num_attention_heads", Some(24))?,
    };
    let mut d = match class.as_str() {
        "SD3Transformer2DModel" => sd3(cfg),
        "FluxTransformer2DModel" => flux(cfg),
        "Flux2Transformer2DModel" => flux2(cfg),
        "QwenImageTransformer2DModel" => qwen_image(cfg),
        "QwenImage21Transformer2DModel" => qwen_image21(cfg),
        "ZImageTransformer2DModel" => z_image(cfg),
        "WanTransformer3DModel" => wan(cfg),
        "LTX2VideoTransformer3DModel" => crate::ltx2::transformer(cfg),
        other => Err(cfg.bad(
            "_class_name",
            format!(
                "`{other}` is not a denoiser the planner knows; known: SD3Transformer2DModel, \
                 FluxTransformer2DModel, Flux2Transformer2DModel, QwenImageTransformer2DModel, \
                 QwenImage21Transformer2DModel, ZImageTransformer2DModel, \
                 WanTransformer3DModel, LTX2VideoTransformer3DModel"
            ),
        )),
    }?;
    d.heads = heads;
    Ok(d)
}

/// An MLP embedder `a → h → h` (two biased linears), as the timestep and text embedders are.
fn embedder(inv: &mut Inventory, name: &str, a: u64, h: u64) {
    inv.linear(1, &format!("{name}.linear_1"), a, h, true);
    inv.linear(1, &format!("{name}.linear_2"), h, h, true);
}

/// q/k RMS norms: `n` of width `w` (`layer_norm` adds a bias).
fn qk_norms(inv: &mut Inventory, cfg: &Json, count: u64, n: u64, w: u64) -> Result<(), PlanError> {
    match cfg.string("qk_norm") {
        None => {}
        Some("rms_norm") | Some("rms_norm_across_heads") => inv.add(count * n * w),
        Some("layer_norm") => inv.add(count * n * 2 * w),
        Some(other) => return Err(cfg.bad("qk_norm", format!("`{other}` is not known"))),
    }
    Ok(())
}

/// The four projections of one attention stream, `count` times under `prefix`.
fn attention(inv: &mut Inventory, count: u64, prefix: &str, names: [&str; 4], h: u64) {
    for n in names {
        inv.linear(count, &format!("{prefix}.{n}"), h, h, true);
    }
}

/// A GELU feed-forward `h → m → h` (diffusers' `FeedForward`: `net.0.proj`, `net.2`).
fn feed_forward(inv: &mut Inventory, count: u64, prefix: &str, h: u64, m: u64) {
    inv.linear(count, &format!("{prefix}.net.0.proj"), h, m, true);
    inv.linear(count, &format!("{prefix}.net.2"), m, h, true);
}

const JOINT: [&str; 4] = ["add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"];
const SELF: [&str; 4] = ["to_q", "to_k", "to_v", "to_out.0"];

fn sd3(cfg: &Json) -> Result<Denoiser, PlanError> {
    let (layers, heads, hd) = (
        cfg.int("num_layers", Some(18))?,
        cfg.int("num_attention_heads", Some(18))?,
        cfg.int("attention_head_dim", Some(64))?,
    );
    let h = heads * hd;
    let (p, cin) = (cfg.int("patch_size", Some(2))?, cfg.int("in_channels", Some(16))?);
    let cout = cfg.int("out_channels", Some(16))?;
    let dual = cfg.ints("dual_attention_layers", Some(&[]))?;
    let mut inv = Inventory::default();
    inv.add(h * cin * p * p + h);
    if let Some(max) = cfg.get("pos_embed_max_size").and_then(|v| v.as_u64()) {
        inv.buffers = max * max * h;
    }
    embedder(&mut inv, "time_text_embed.timestep_embedder", 256, h);
    let pooled = cfg.int("pooled_projection_dim", Some(2048))?;
    embedder(&mut inv, "time_text_embed.text_embedder", pooled, h);
    let joint = cfg.int("joint_attention_dim", Some(4096))?;
    inv.linear(1, "context_embedder", joint, cfg.int("caption_projection_dim", Some(h))?, true);
    let b = "transformer_blocks.0";
    let n_dual = dual.iter().filter(|&&i| i < layers).count() as u64;
    // Every block but the last ("context_pre_only") updates the text stream.
    let full = layers.saturating_sub(1);
    // Dual-attention blocks (any indices) have a wider norm1 and a second attention.
    for i in 0..layers {
        let (block, dual) = (format!("transformer_blocks.{i}"), dual.contains(&i));
        inv.linear(1, &format!("{block}.norm1.linear"), h, if dual { 9 } else { 6 } * h, true);
        if dual {
            attention(&mut inv, 1, &format!("{block}.attn2"), SELF, h);
        }
    }
    inv.linear(full, &format!("{b}.norm1_context.linear"), h, 6 * h, true);
    let last = format!("transformer_blocks.{full}.norm1_context.linear");
    inv.linear(layers - full, &last, h, 2 * h, true);
    attention(&mut inv, layers, &format!("{b}.attn"), SELF, h);
    for n in &JOINT[..3] {
        inv.linear(layers, &format!("{b}.attn.{n}"), h, h, true);
    }
    inv.linear(full, &format!("{b}.attn.to_add_out"), h, h, true);
    qk_norms(&mut inv, cfg, layers, 4, hd)?;
    qk_norms(&mut inv, cfg, n_dual, 2, hd)?;
    feed_forward(&mut inv, layers, &format!("{b}.ff"), h, 4 * h);
    feed_forward(&mut inv, full, &format!("{b}.ff_context"), h, 4 * h);
    inv.linear(1, "norm_out.linear", h, 2 * h, true);
    inv.linear(1, "proj_out", h, p * p * cout, true);
    let blocks =
        vec![(n_dual, c::SD3_DUAL, Tokens::All), (layers - n_dual, c::SD3_PLAIN, Tokens::All)];
    Ok(image(cfg, inv, h, blocks, p, joint, cin))
}

fn image(
    cfg: &Json,
    inventory: Inventory,
    hidden: u64,
    blocks: Vec<(u64, Saved, Tokens)>,
    patch: u64,
    text_width: u64,
    in_channels: u64,
) -> Denoiser {
    Denoiser {
        class: cfg.class().unwrap_or_default(),
        inventory,
        hidden,
        blocks: blocks.into_iter().filter(|b| b.0 > 0).collect(),
        patch,
        temporal_patch: 1,
        joint_text: true,
        text_width,
        in_channels,
        heads: 0,
        audio: None,
    }
}

fn flux(cfg: &Json) -> Result<Denoiser, PlanError> {
    let (double, single) =
        (cfg.int("num_layers", Some(19))?, cfg.int("num_single_layers", Some(38))?);
    let hd = cfg.int("attention_head_dim", Some(128))?;
    let h = cfg.int("num_attention_heads", Some(24))? * hd;
    let (p, cin) = (cfg.int("patch_size", Some(1))?, cfg.int("in_channels", Some(64))?);
    let cout = cfg.int("out_channels", Some(cin))?;
    let joint = cfg.int("joint_attention_dim", Some(4096))?;
    let mut inv = Inventory::default();
    inv.linear(1, "x_embedder", cin, h, true);
    inv.linear(1, "context_embedder", joint, h, true);
    embedder(&mut inv, "time_text_embed.timestep_embedder", 256, h);
    if cfg.boolean("guidance_embeds", false)? {
        embedder(&mut inv, "time_text_embed.guidance_embedder", 256, h);
    }
    let pooled = cfg.int("pooled_projection_dim", Some(768))?;
    embedder(&mut inv, "time_text_embed.text_embedder", pooled, h);
    let b = "transformer_blocks.0";
    inv.linear(double, &format!("{b}.norm1.linear"), h, 6 * h, true);
    inv.linear(double, &format!("{b}.norm1_context.linear"), h, 6 * h, true);
    attention(&mut inv, double, &format!("{b}.attn"), SELF, h);
    attention(&mut inv, double, &format!("{b}.attn"), JOINT, h);
    feed_forward(&mut inv, double, &format!("{b}.ff"), h, 4 * h);
    feed_forward(&mut inv, double, &format!("{b}.ff_context"), h, 4 * h);
    inv.add(double * 4 * hd);
    let s = "single_transformer_blocks.0";
    inv.linear(single, &format!("{s}.norm.linear"), h, 3 * h, true);
    inv.linear(single, &format!("{s}.proj_mlp"), h, 4 * h, true);
    inv.linear(single, &format!("{s}.proj_out"), 5 * h, h, true);
    for n in ["to_q", "to_k", "to_v"] {
        inv.linear(single, &format!("{s}.attn.{n}"), h, h, true);
    }
    inv.add(single * 2 * hd);
    inv.linear(1, "norm_out.linear", h, 2 * h, true);
    inv.linear(1, "proj_out", h, p * p * cout, true);
    let blocks = vec![(double, c::FLUX_DOUBLE, Tokens::All), (single, c::FLUX_SINGLE, Tokens::All)];
    // Latents are 2×2-packed: 64 channels are 16 latent channels.
    Ok(image(cfg, inv, h, blocks, 2 * p, joint, cin / 4))
}

/// FLUX.2: no biases, modulations shared by all blocks, SwiGLU feed-forwards of width
/// `mlp_ratio · h`, the single blocks' projections fused. Its block constants are FLUX.1's
/// (not measured for FLUX.2).
fn flux2(cfg: &Json) -> Result<Denoiser, PlanError> {
    let (double, single) =
        (cfg.int("num_layers", Some(8))?, cfg.int("num_single_layers", Some(48))?);
    let hd = cfg.int("attention_head_dim", Some(128))?;
    let h = cfg.int("num_attention_heads", Some(48))? * hd;
    let (p, cin) = (cfg.int("patch_size", Some(1))?, cfg.int("in_channels", Some(128))?);
    let cout = cfg.int("out_channels", Some(cin))?;
    let joint = cfg.int("joint_attention_dim", Some(15360))?;
    let t = cfg.int("timestep_guidance_channels", Some(256))?;
    let ratio = cfg.get("mlp_ratio").and_then(|v| v.as_f64()).unwrap_or(3.0);
    let m = (h as f64 * ratio) as u64;
    let mut inv = Inventory::default();
    let mut embedder = |name: &str| {
        inv.linear(1, &format!("time_guidance_embed.{name}.linear_1"), t, h, false);
        inv.linear(1, &format!("time_guidance_embed.{name}.linear_2"), h, h, false);
    };
    embedder("timestep_embedder");
    if cfg.boolean("guidance_embeds", true)? {
        embedder("guidance_embedder");
    }
    inv.linear(1, "double_stream_modulation_img.linear", h, 6 * h, false);
    inv.linear(1, "double_stream_modulation_txt.linear", h, 6 * h, false);
    inv.linear(1, "single_stream_modulation.linear", h, 3 * h, false);
    inv.linear(1, "x_embedder", cin, h, false);
    inv.linear(1, "context_embedder", joint, h, false);
    let b = "transformer_blocks.0";
    for n in SELF.iter().chain(&JOINT) {
        inv.linear(double, &format!("{b}.attn.{n}"), h, h, false);
    }
    for ff in ["ff", "ff_context"] {
        inv.linear(double, &format!("{b}.{ff}.linear_in"), h, 2 * m, false);
        inv.linear(double, &format!("{b}.{ff}.linear_out"), m, h, false);
    }
    inv.add(double * 4 * hd);
    let s = "single_transformer_blocks.0";
    inv.linear(single, &format!("{s}.attn.to_qkv_mlp_proj"), h, 3 * h + 2 * m, false);
    inv.linear(single, &format!("{s}.attn.to_out"), h + m, h, false);
    inv.add(single * 2 * hd);
    inv.linear(1, "norm_out.linear", h, 2 * h, false);
    inv.linear(1, "proj_out", h, p * p * cout, false);
    let blocks = vec![(double, c::FLUX_DOUBLE, Tokens::All), (single, c::FLUX_SINGLE, Tokens::All)];
    // A token is a 2×2 patch of the VAE latent: 128 channels are 32 latent channels.
    Ok(image(cfg, inv, h, blocks, 2 * p, joint, cin / 4))
}

/// Qwen-Image 2.1: single-stream blocks without biases, one modulation shared by all blocks,
/// SwiGLU feed-forwards of width `mlp_ratio · h`, one token per latent cell. Its block constant
/// is FLUX.1's single-stream one (not measured for Qwen-Image 2.1).
fn qwen_image21(cfg: &Json) -> Result<Denoiser, PlanError> {
    let layers = cfg.int("num_layers", Some(32))?;
    let hd = cfg.int("attention_head_dim", Some(128))?;
    let h = cfg.int("num_attention_heads", Some(32))? * hd;
    let (p, cin) = (cfg.int("patch_size", Some(1))?, cfg.int("in_channels", Some(64))?);
    let cout = cfg.int("out_channels", Some(cin))?;
    let context = cfg.int("context_in_dim", Some(4096))?;
    let m = h * cfg.int("mlp_ratio", Some(3))?;
    let mut inv = Inventory::default();
    inv.linear(1, "time_text_embed.timestep_embedder.linear_1", 256, h, false);
    inv.linear(1, "time_text_embed.timestep_embedder.linear_2", h, h, false);
    inv.add(context);
    inv.linear(1, "txt_in.in_layer", context, h, false);
    inv.linear(1, "txt_in.out_layer", h, h, false);
    inv.linear(1, "img_in", p * p * cin, h, false);
    inv.linear(1, "modulation.1", h, 4 * h, false);
    let b = "transformer_blocks.0";
    for n in SELF {
        inv.linear(layers, &format!("{b}.attn.{n}"), h, h, false);
    }
    inv.linear(layers, &format!("{b}.img_mlp.proj"), h, m, false);
    inv.linear(layers, &format!("{b}.img_mlp.gate_layer"), h, m, false);
    inv.linear(layers, &format!("{b}.img_mlp.out"), m, h, false);
    inv.add(layers * 2 * hd);
    inv.linear(1, "norm_out.linear", h, h, false);
    inv.linear(1, "proj_out", h, p * p * cout, false);
    Ok(image(cfg, inv, h, vec![(layers, c::FLUX_SINGLE, Tokens::All)], p, context, cin))
}

fn qwen_image(cfg: &Json) -> Result<Denoiser, PlanError> {
    let layers = cfg.int("num_layers", Some(60))?;
    let hd = cfg.int("attention_head_dim", Some(128))?;
    let h = cfg.int("num_attention_heads", Some(24))? * hd;
    let (p, cin) = (cfg.int("patch_size", Some(2))?, cfg.int("in_channels", Some(64))?);
    let cout = cfg.int("out_channels", Some(16))?;
    let joint = cfg.int("joint_attention_dim", Some(3584))?;
    let mut inv = Inventory::default();
    embedder(&mut inv, "time_text_embed.timestep_embedder", 256, h);
    inv.add(joint);
    inv.linear(1, "img_in", cin, h, true);
    inv.linear(1, "txt_in", joint, h, true);
    let b = "transformer_blocks.0";
    inv.linear(layers, &format!("{b}.img_mod.1"), h, 6 * h, true);
    inv.linear(layers, &format!("{b}.txt_mod.1"), h, 6 * h, true);
    attention(&mut inv, layers, &format!("{b}.attn"), SELF, h);
    attention(&mut inv, layers, &format!("{b}.attn"), JOINT, h);
    inv.add(layers * 4 * hd);
    feed_forward(&mut inv, layers, &format!("{b}.img_mlp"), h, 4 * h);
    feed_forward(&mut inv, layers, &format!("{b}.txt_mlp"), h, 4 * h);
    inv.linear(1, "norm_out.linear", h, 2 * h, true);
    inv.linear(1, "proj_out", h, p * p * cout, true);
    Ok(image(cfg, inv, h, vec![(layers, c::QWEN_IMAGE, Tokens::All)], p, joint, cin / (p * p)))
}

fn z_image(cfg: &Json) -> Result<Denoiser, PlanError> {
    let dim = cfg.int("dim", Some(3840))?;
    let (layers, refiners) =
        (cfg.int("n_layers", Some(30))?, cfg.int("n_refiner_layers", Some(2))?);
    let heads = cfg.int("n_heads", Some(30))?;
    let kv = cfg.int("n_kv_heads", Some(heads))?;
    let hd = dim / heads;
    let cin = cfg.int("in_channels", Some(16))?;
    let caption = cfg.int("cap_feat_dim", Some(2560))?;
    let patches = cfg.ints("all_patch_size", Some(&[2]))?;
    let frames = cfg.ints("all_f_patch_size", Some(&[1]))?;
    if patches.len() != frames.len() {
        return Err(cfg.bad("all_f_patch_size", "needs one entry per all_patch_size entry"));
    }
    let ffn = dim * 8 / 3;
    let ada = dim.min(256);
    let mut inv = Inventory::default();
    let block = |inv: &mut Inventory, count: u64, prefix: &str, modulated: bool| {
        let a = format!("{prefix}.attention");
        inv.linear(count, &format!("{a}.to_q"), dim, heads * hd, false);
        inv.linear(count, &format!("{a}.to_k"), dim, kv * hd, false);
        inv.linear(count, &format!("{a}.to_v"), dim, kv * hd, false);
        inv.linear(count, &format!("{a}.to_out.0"), heads * hd, dim, false);
        let f = format!("{prefix}.feed_forward");
        inv.linear(count, &format!("{f}.w1"), dim, ffn, false);
        inv.linear(count, &format!("{f}.w2"), ffn, dim, false);
        inv.linear(count, &format!("{f}.w3"), dim, ffn, false);
        inv.add(count * 4 * dim);
        if modulated {
            inv.linear(count, &format!("{prefix}.adaLN_modulation.0"), ada, 4 * dim, true);
        }
    };
    block(&mut inv, layers, "layers.0", true);
    block(&mut inv, refiners, "noise_refiner.0", true);
    block(&mut inv, refiners, "context_refiner.0", false);
    qk_norms_z(&mut inv, cfg, layers + 2 * refiners, hd)?;
    inv.linear(1, "t_embedder.mlp.0", 256, 1024, true);
    inv.linear(1, "t_embedder.mlp.2", 1024, ada, true);
    inv.add(caption);
    inv.linear(1, "cap_embedder.1", caption, dim, true);
    for (p, f) in patches.iter().zip(&frames) {
        let k = format!("{p}-{f}");
        inv.linear(1, &format!("all_x_embedder.{k}"), f * p * p * cin, dim, true);
        inv.linear(1, &format!("all_final_layer.{k}.linear"), dim, p * p * f * cin, true);
        inv.linear(1, &format!("all_final_layer.{k}.adaLN_modulation.1"), ada, dim, true);
    }
    // The image and caption pad tokens.
    inv.add(2 * dim);
    // The refiners run over one stream each before the main layers join them.
    let blocks = vec![
        (layers, c::Z_IMAGE, Tokens::All),
        (refiners, c::Z_IMAGE, Tokens::Image),
        (refiners, c::Z_IMAGE, Tokens::Text),
    ];
    Ok(image(cfg, inv, dim, blocks, patches[0], caption, cin))
}

fn qk_norms_z(inv: &mut Inventory, cfg: &Json, count: u64, hd: u64) -> Result<(), PlanError> {
    if cfg.boolean("qk_norm", true)? {
        inv.add(count * 2 * hd);
    }
    Ok(())
}

fn wan(cfg: &Json) -> Result<Denoiser, PlanError> {
    let layers = cfg.int("num_layers", Some(40))?;
    let hd = cfg.int("attention_head_dim", Some(128))?;
    let h = cfg.int("num_attention_heads", Some(40))? * hd;
    let patch = cfg.ints("patch_size", Some(&[1, 2, 2]))?;
    if patch.len() != 3 {
        return Err(cfg.bad("patch_size", "expected [t, h, w]"));
    }
    let kernel: u64 = patch.iter().product();
    let cin = cfg.int("in_channels", Some(16))?;
    let cout = cfg.int("out_channels", Some(16))?;
    let (text, freq) = (cfg.int("text_dim", Some(4096))?, cfg.int("freq_dim", Some(256))?);
    let ffn = cfg.int("ffn_dim", Some(13824))?;
    let mut inv = Inventory::default();
    inv.add(h * cin * kernel + h);
    let e = "condition_embedder";
    inv.linear(1, &format!("{e}.time_embedder.linear_1"), freq, h, true);
    inv.linear(1, &format!("{e}.time_embedder.linear_2"), h, h, true);
    inv.linear(1, &format!("{e}.time_proj"), h, 6 * h, true);
    embedder(&mut inv, &format!("{e}.text_embedder"), text, h);
    if cfg.get("image_dim").is_some() {
        return Err(
            cfg.bad("image_dim", "Wan2.1 image-to-video image embeddings are not planned yet")
        );
    }
    let b = "blocks.0";
    inv.add(layers * 6 * h);
    attention(&mut inv, layers, &format!("{b}.attn1"), SELF, h);
    attention(&mut inv, layers, &format!("{b}.attn2"), SELF, h);
    let norm_width = if cfg.string("qk_norm") == Some("rms_norm_across_heads") { h } else { hd };
    qk_norms(&mut inv, cfg, layers, 4, norm_width)?;
    if cfg.boolean("cross_attn_norm", true)? {
        inv.add(layers * 2 * h);
    }
    feed_forward(&mut inv, layers, &format!("{b}.ffn"), h, ffn);
    inv.add(2 * h);
    inv.linear(1, "proj_out", h, cout * kernel, true);
    let c = if ffn >= 4 * h { c::WAN_5B } else { c::WAN_A14B };
    let mut d = image(cfg, inv, h, vec![(layers, c, Tokens::All)], patch[1], text, cin);
    d.temporal_patch = patch[0];
    d.joint_text = false;
    Ok(d)
}
