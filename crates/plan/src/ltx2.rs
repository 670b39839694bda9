//! LTX-2 (`LTX2VideoTransformer3DModel`) and its text connectors (`LTX2TextConnectors`), laid
//! out as diffusers 0.42.1 builds them (`models/transformers/transformer_ltx2.py`,
//! `pipelines/ltx2/connectors.py`). One block runs two token streams: video tokens at width h
//! and audio tokens at width h_a, which meet in the audio-to-video and video-to-audio
//! cross-attentions.

use crate::denoisers::{c, AudioStream, Denoiser, Tokens};
use crate::inventory::Inventory;
use crate::json::Json;
use crate::PlanError;

/// One `LTX2Attention`: q from `query` wide states, k/v from `kv` wide ones, `heads × hd` inner,
/// q/k RMS norms with a gain over the inner width, and per-head gates when `gated`.
struct Attention {
    query: u64,
    kv: u64,
    heads: u64,
    hd: u64,
    gated: bool,
}

impl Attention {
    fn add(&self, inv: &mut Inventory, count: u64, prefix: &str, bias: bool, out_bias: bool) {
        let inner = self.heads * self.hd;
        inv.linear(count, &format!("{prefix}.to_q"), self.query, inner, bias);
        inv.linear(count, &format!("{prefix}.to_k"), self.kv, inner, bias);
        inv.linear(count, &format!("{prefix}.to_v"), self.kv, inner, bias);
        inv.linear(count, &format!("{prefix}.to_out.0"), inner, self.query, out_bias);
        inv.add(count * 2 * inner);
        if self.gated {
            inv.linear(count, &format!("{prefix}.to_gate_logits"), self.query, self.heads, true);
        }
    }
}

/// A GELU feed-forward `w → 4w → w` (diffusers' `FeedForward`).
fn feed_forward(inv: &mut Inventory, count: u64, prefix: &str, w: u64, bias: bool) {
    inv.linear(count, &format!("{prefix}.net.0.proj"), w, 4 * w, bias);
    inv.linear(count, &format!("{prefix}.net.2"), 4 * w, w, bias);
}

/// `LTX2AdaLayerNormSingle`: a timestep MLP `256 → w → w` and `n` modulation vectors of width w.
fn ada_single(inv: &mut Inventory, name: &str, w: u64, n: u64) {
    inv.linear(1, &format!("{name}.emb.timestep_embedder.linear_1"), 256, w, true);
    inv.linear(1, &format!("{name}.emb.timestep_embedder.linear_2"), w, w, true);
    inv.linear(1, &format!("{name}.linear"), w, n * w, true);
}

pub fn transformer(cfg: &Json) -> Result<Denoiser, PlanError> {
    let layers = cfg.int("num_layers", Some(48))?;
    let (heads, hd) =
        (cfg.int("num_attention_heads", Some(32))?, cfg.int("attention_head_dim", Some(128))?);
    let (a_heads, a_hd) = (
        cfg.int("audio_num_attention_heads", Some(32))?,
        cfg.int("audio_attention_head_dim", Some(64))?,
    );
    let (h, ha) = (heads * hd, a_heads * a_hd);
    let cin = cfg.int("in_channels", Some(128))?;
    let cout = cfg.int("out_channels", Some(cin))?;
    let a_cin = cfg.int("audio_in_channels", Some(128))?;
    let a_cout = cfg.int("audio_out_channels", Some(a_cin))?;
    let (text, a_text) = (
        cfg.int("cross_attention_dim", Some(4096))?,
        cfg.int("audio_cross_attention_dim", Some(2048))?,
    );
    let caption = cfg.int("caption_channels", Some(3840))?;
    let (gated, a_gated) =
        (cfg.boolean("gated_attn", false)?, cfg.boolean("audio_gated_attn", false)?);
    let (modulated, a_modulated) =
        (cfg.boolean("cross_attn_mod", false)?, cfg.boolean("audio_cross_attn_mod", false)?);
    let (bias, out_bias) =
        (cfg.boolean("attention_bias", true)?, cfg.boolean("attention_out_bias", true)?);
    let (ff_bias, a_ff_bias) = (cfg.boolean("ff_bias", true)?, cfg.boolean("audio_ff_bias", true)?);
    if let Some(norm) = cfg.string("qk_norm").filter(|&n| n != "rms_norm_across_heads") {
        return Err(cfg.bad("qk_norm", format!("`{norm}` is not known")));
    }
    let patch = cfg.int("patch_size", Some(1))?;
    let patch_t = cfg.int("patch_size_t", Some(1))?;
    let mut inv = Inventory::default();
    inv.linear(1, "proj_in", cin, h, true);
    inv.linear(1, "audio_proj_in", a_cin, ha, true);
    if cfg.boolean("use_keyframes_abs_pos_embedding", false)? {
        inv.add(h);
    }
    // LTX-2.0 projects the connectors' outputs here; LTX-2.3's connectors project per stream.
    let prompt_embeddings = cfg.boolean("use_prompt_embeddings", true)?;
    if prompt_embeddings {
        for (name, w) in [("caption_projection", h), ("audio_caption_projection", ha)] {
            inv.linear(1, &format!("{name}.linear_1"), caption, w, true);
            inv.linear(1, &format!("{name}.linear_2"), w, w, true);
        }
    }
    // Global modulations: 9 vectors with the prompt cross-attention's query modulation.
    let mods = |on: bool| if on { 9 } else { 6 };
    ada_single(&mut inv, "time_embed", h, mods(modulated));
    ada_single(&mut inv, "audio_time_embed", ha, mods(a_modulated));
    ada_single(&mut inv, "av_cross_attn_video_scale_shift", h, 4);
    ada_single(&mut inv, "av_cross_attn_audio_scale_shift", ha, 4);
    ada_single(&mut inv, "av_cross_attn_video_a2v_gate", h, 1);
    ada_single(&mut inv, "av_cross_attn_audio_v2a_gate", ha, 1);
    inv.add(2 * h + 2 * ha);
    let prompt_mod = modulated || a_modulated;
    if prompt_mod && cfg.boolean("use_prompt_adaln_single", true)? {
        ada_single(&mut inv, "prompt_adaln", h, 2);
        ada_single(&mut inv, "audio_prompt_adaln", ha, 2);
    }
    let b = "transformer_blocks.0";
    let video = |kv, heads, hd| Attention { query: h, kv, heads, hd, gated };
    let audio = |kv, hd| Attention { query: ha, kv, heads: a_heads, hd, gated: a_gated };
    let attentions = [
        ("attn1", video(h, heads, hd)),
        ("audio_attn1", audio(ha, a_hd)),
        ("attn2", video(text, heads, hd)),
        ("audio_attn2", audio(a_text, a_hd)),
        // Audio to video: video queries, audio keys and values, at the audio heads.
        ("audio_to_video_attn", video(ha, a_heads, a_hd)),
        ("video_to_audio_attn", audio(h, a_hd)),
    ];
    for (name, a) in attentions {
        a.add(&mut inv, layers, &format!("{b}.{name}"), bias, out_bias);
    }
    feed_forward(&mut inv, layers, &format!("{b}.ff"), h, ff_bias);
    feed_forward(&mut inv, layers, &format!("{b}.audio_ff"), ha, a_ff_bias);
    // Four RMS norms per stream (gains only when affine), the per-block modulation tables.
    if cfg.boolean("norm_elementwise_affine", false)? {
        inv.add(layers * 4 * (h + ha));
    }
    let prompt_tables = if prompt_mod { 2 * (h + ha) } else { 0 };
    inv.add(layers * (mods(modulated) * h + mods(a_modulated) * ha + prompt_tables + 5 * (h + ha)));
    inv.linear(1, "proj_out", h, cout * patch * patch * patch_t, true);
    inv.linear(1, "audio_proj_out", ha, a_cout, true);
    // What the connectors hand each stream per text token.
    let text_width = if prompt_embeddings { 2 * caption } else { text + a_text };
    let per_second = cfg.float("audio_sampling_rate", Some(16000.0))?
        / cfg.float("audio_hop_length", Some(160.0))?
        / cfg.float("audio_scale_factor", Some(4.0))?;
    Ok(Denoiser {
        class: cfg.class().unwrap_or_default(),
        inventory: inv,
        hidden: h,
        blocks: vec![(layers, c::LTX2, Tokens::All)],
        patch,
        temporal_patch: patch_t,
        joint_text: false,
        text_width,
        in_channels: cin,
        heads,
        audio: Some(AudioStream { width: ha, channels: a_cin, per_second }),
    })
}

/// `LTX2TextConnectors`: the projection of Gemma's stacked hidden states (one shared, or one per
/// stream in LTX-2.3) and a 1-D transformer per stream, with learnable register tokens.
pub fn connectors(cfg: &Json) -> Result<u64, PlanError> {
    let caption = cfg.int("caption_channels", Some(3840))?;
    let stacked = caption * cfg.int("text_proj_in_factor", Some(49))?;
    let bias = cfg.boolean("proj_bias", false)?;
    let mut inv = Inventory::default();
    if cfg.boolean("per_modality_projections", false)? {
        inv.linear(
            1,
            "video_text_proj_in",
            stacked,
            cfg.int("video_hidden_dim", Some(4096))?,
            bias,
        );
        inv.linear(
            1,
            "audio_text_proj_in",
            stacked,
            cfg.int("audio_hidden_dim", Some(2048))?,
            bias,
        );
    } else {
        inv.linear(1, "text_proj_in", stacked, caption, bias);
    }
    for stream in ["video", "audio"] {
        let key = |k: &str| format!("{stream}_connector_{k}");
        let heads = cfg.int(&key("num_attention_heads"), Some(30))?;
        let hd = cfg.int(&key("attention_head_dim"), Some(128))?;
        let layers = cfg.int(&key("num_layers"), Some(2))?;
        let registers = match cfg.get(&key("num_learnable_registers")) {
            Some(_) => cfg.int(&key("num_learnable_registers"), None)?,
            // Absent: diffusers' 128; null: none.
            None if cfg.is_null(&key("num_learnable_registers")) => 0,
            None => 128,
        };
        let gated = cfg.boolean(&format!("{stream}_gated_attn"), false)?;
        let w = heads * hd;
        inv.add(registers * w);
        let prefix = format!("{stream}_connector.transformer_blocks.0");
        let attn = Attention { query: w, kv: w, heads, hd, gated };
        attn.add(&mut inv, layers, &format!("{prefix}.attn1"), true, true);
        feed_forward(&mut inv, layers, &format!("{prefix}.ff"), w, true);
    }
    Ok(inv.params())
}
