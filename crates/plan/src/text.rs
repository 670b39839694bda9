//! Text encoders from their `config.json`: parameter counts as transformers 5.24 builds CLIP,
//! T5/UMT5 encoders, Qwen2.5-VL, Qwen3, and the language models of Qwen3-VL, Mistral3 and Gemma-3
//! (`src/transformers/models/<name>/modeling_<name>.py`), and LTX-2's text connectors.

use crate::json::Json;
use crate::PlanError;

/// The parameters of the text encoder whose config is `cfg`, by its class.
pub fn text_encoder(cfg: &Json, class: &str) -> Result<u64, PlanError> {
    match class {
        "CLIPTextModel" => clip(cfg, false),
        "CLIPTextModelWithProjection" => clip(cfg, true),
        "T5EncoderModel" => t5(cfg, false),
        "UMT5EncoderModel" => t5(cfg, true),
        "Qwen2_5_VLForConditionalGeneration" => qwen2_5_vl(cfg),
        "Qwen3Model" | "Qwen3ForCausalLM" => qwen3(cfg, class == "Qwen3ForCausalLM"),
        // Qwen-Image 2.1 runs the language model and the vision tower (no LM head).
        "Qwen3VLForConditionalGeneration" => Ok(qwen3(&cfg.nested_or_self("text_config"), false)?
            + qwen3_vl_vision(&cfg.nested_or_self("vision_config"))?),
        // FLUX.2 [dev] runs Mistral's language model only (no Pixtral tower, no LM head).
        "Mistral3ForConditionalGeneration" => {
            Ok(Decoder::read(&cfg.nested_or_self("text_config"))?.params(false, 0))
        }
        // LTX-2 runs Gemma-3's language model only (no SigLIP tower, no LM head).
        "Gemma3ForConditionalGeneration" | "Gemma3TextModel" => {
            gemma3(&cfg.nested_or_self("text_config"))
        }
        // LTX-2's connectors, which turn Gemma's hidden states into each stream's text states.
        "LTX2TextConnectors" => crate::ltx2::connectors(cfg),
        other => Err(cfg.bad(
            "architectures",
            format!(
                "`{other}` is not a text encoder the planner knows; known: CLIPTextModel, \
                 CLIPTextModelWithProjection, T5EncoderModel, UMT5EncoderModel, \
                 Qwen2_5_VLForConditionalGeneration, Qwen3Model, \
                 Qwen3VLForConditionalGeneration, Mistral3ForConditionalGeneration, \
                 Gemma3ForConditionalGeneration, LTX2TextConnectors"
            ),
        )),
    }
}

/// The parameters of a vision-language judge (both towers and the language-model head, unless
/// tied to the token embeddings), by its class.
pub fn judge(cfg: &Json, class: &str) -> Result<u64, PlanError> {
    match class {
        "Qwen2_5_VLForConditionalGeneration" => qwen2_5_vl(cfg),
        "Qwen2VLForConditionalGeneration" | "Qwen3VLForConditionalGeneration" => {
            let text = cfg.nested_or_self("text_config");
            let lm = Decoder::read(&text)?;
            // transformers 5 ties when either level says so.
            let tied = cfg.boolean("tie_word_embeddings", false)?
                || text.boolean("tie_word_embeddings", false)?;
            let head = if tied { 0 } else { lm.vocab * lm.d };
            let vision = cfg.nested_or_self("vision_config");
            Ok(head
                + match class {
                    "Qwen2VLForConditionalGeneration" => {
                        lm.params(true, 0) + qwen2_vl_vision(&vision)?
                    }
                    _ => qwen3(&text, false)? + qwen3_vl_vision(&vision)?,
                })
        }
        other => Err(cfg.bad(
            "architectures",
            format!(
                "`{other}` is not a judge flowtune runs; known: \
                 Qwen2VLForConditionalGeneration, Qwen2_5_VLForConditionalGeneration, \
                 Qwen3VLForConditionalGeneration"
            ),
        )),
    }
}

/// A preference model's head on `hidden`-wide states (HPSv3's: hidden → 1024 → 16 → `outputs`,
/// biased).
pub fn preference_head(hidden: u64, outputs: u64) -> u64 {
    (hidden * 1024 + 1024) + (1024 * 16 + 16) + (16 * outputs + outputs)
}

/// Qwen2-VL's ViT: a bias-free 3-D patch embedding, LayerNorm blocks with a fused biased qkv and
/// a biased MLP of `mlp_ratio`, the merger's LayerNorm and two biased layers to `hidden_size`.
fn qwen2_vl_vision(cfg: &Json) -> Result<u64, PlanError> {
    let d = cfg.int("embed_dim", Some(1280))?;
    let f = (d as f64 * cfg.float("mlp_ratio", Some(4.0))?) as u64;
    let depth = cfg.int("depth", Some(32))?;
    let (p, t) = (cfg.int("patch_size", Some(14))?, cfg.int("temporal_patch_size", Some(2))?);
    let channels = cfg.int("in_channels", Some(cfg.int("in_chans", Some(3))?))?;
    let merged = d * cfg.int("spatial_merge_size", Some(2))?.pow(2);
    let out = cfg.int("hidden_size", Some(3584))?;
    let block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d);
    Ok(d * channels * t * p * p
        + depth * block
        + 2 * d
        + (merged * merged + merged)
        + (merged * out + out))
}

/// CLIP's text tower: token and position embeddings, pre-LN blocks with biased projections,
/// a final LayerNorm; `projection` adds the bias-free text projection.
fn clip(cfg: &Json, projection: bool) -> Result<u64, PlanError> {
    let d = cfg.int("hidden_size", Some(512))?;
    let f = cfg.int("intermediate_size", Some(2048))?;
    let layers = cfg.int("num_hidden_layers", Some(12))?;
    let vocab = cfg.int("vocab_size", Some(49408))?;
    let positions = cfg.int("max_position_embeddings", Some(77))?;
    let block = 4 * (d * d + d) + 2 * 2 * d + (d * f + f) + (f * d + d);
    let proj = if projection { d * cfg.int("projection_dim", Some(512))? } else { 0 };
    Ok((vocab + positions) * d + layers * block + 2 * d + proj)
}

/// The T5 encoder: shared embedding, bias-free attention and (gated) feed-forward, RMS norms;
/// relative-position tables in the first block (T5) or every block (UMT5).
fn t5(cfg: &Json, every_block_bias: bool) -> Result<u64, PlanError> {
    let d = cfg.int("d_model", Some(512))?;
    let inner = cfg.int("num_heads", Some(8))? * cfg.int("d_kv", Some(64))?;
    let f = cfg.int("d_ff", Some(2048))?;
    let layers = cfg.int("num_layers", Some(6))?;
    let vocab = cfg.int("vocab_size", Some(32128))?;
    let gated = cfg.string("feed_forward_proj").is_some_and(|s| s.starts_with("gated-"));
    let ff = if gated { 3 * d * f } else { 2 * d * f };
    let table =
        cfg.int("relative_attention_num_buckets", Some(32))? * cfg.int("num_heads", Some(8))?;
    let tables = if every_block_bias { layers * table } else { table };
    Ok(vocab * d + layers * (4 * d * inner + ff + 2 * d) + tables + d)
}

/// A Qwen2/Qwen3/Mistral decoder stack: embeddings, GQA attention, SwiGLU MLP, RMS norms.
struct Decoder {
    d: u64,
    layers: u64,
    vocab: u64,
    q: u64,
    kv: u64,
    f: u64,
}

impl Decoder {
    fn read(cfg: &Json) -> Result<Self, PlanError> {
        let d = cfg.int("hidden_size", None)?;
        let heads = cfg.int("num_attention_heads", None)?;
        let hd = cfg.int("head_dim", Some(d / heads))?;
        Ok(Self {
            d,
            layers: cfg.int("num_hidden_layers", None)?,
            vocab: cfg.int("vocab_size", None)?,
            q: heads * hd,
            kv: cfg.int("num_key_value_heads", Some(heads))? * hd,
            f: cfg.int("intermediate_size", None)?,
        })
    }

    /// Parameters with `qkv_bias` (Qwen2) or per-head q/k norms of `head_norm` (Qwen3).
    fn params(&self, qkv_bias: bool, head_norm: u64) -> u64 {
        let Self { d, layers, vocab, q, kv, f } = *self;
        let attention = d * (q + 2 * kv) + q * d + if qkv_bias { q + 2 * kv } else { 0 };
        vocab * d + layers * (attention + 2 * head_norm + 3 * d * f + 2 * d) + d
    }
}

/// Qwen2.5-VL: the Qwen2 language model, its untied LM head, and the vision tower.
fn qwen2_5_vl(cfg: &Json) -> Result<u64, PlanError> {
    let text = cfg.nested_or_self("text_config");
    let lm = Decoder::read(&text)?;
    let tied = text.boolean("tie_word_embeddings", cfg.boolean("tie_word_embeddings", false)?)?;
    let head = if tied { 0 } else { lm.vocab * lm.d };
    let v = cfg.get("vision_config").map(|_| cfg.nested_or_self("vision_config"));
    let vision = match v {
        Some(v) => vision(&v)?,
        None => return Err(cfg.bad("vision_config", "missing")),
    };
    Ok(lm.params(true, 0) + head + vision)
}

/// Qwen2.5-VL's ViT: 3-D patch embedding, SwiGLU blocks with biases, the 2×2 patch merger.
fn vision(cfg: &Json) -> Result<u64, PlanError> {
    let d = cfg.int("hidden_size", Some(1280))?;
    let f = cfg.int("intermediate_size", Some(3420))?;
    let depth = cfg.int("depth", Some(32))?;
    let (p, t) = (cfg.int("patch_size", Some(14))?, cfg.int("temporal_patch_size", Some(2))?);
    let channels = cfg.int("in_channels", Some(3))?;
    let merged = d * cfg.int("spatial_merge_size", Some(2))?.pow(2);
    let out = cfg.int("out_hidden_size", Some(3584))?;
    let block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * (d * f + f) + (f * d + d);
    let merger = d + (merged * merged + merged) + (merged * out + out);
    Ok(d * channels * t * p * p + depth * block + merger)
}

/// Qwen3-VL's ViT: 3-D patch embedding with bias, a learned position table, LayerNorm blocks with
/// a fused biased qkv and a GELU MLP, the 2×2 merger and one deepstack merger (LayerNorm after the
/// shuffle) per `deepstack_visual_indexes` entry.
fn qwen3_vl_vision(cfg: &Json) -> Result<u64, PlanError> {
    let d = cfg.int("hidden_size", Some(1152))?;
    let f = cfg.int("intermediate_size", Some(4304))?;
    let depth = cfg.int("depth", Some(27))?;
    let (p, t) = (cfg.int("patch_size", Some(16))?, cfg.int("temporal_patch_size", Some(2))?);
    let channels = cfg.int("in_channels", Some(3))?;
    let positions = cfg.int("num_position_embeddings", Some(2304))?;
    let merged = d * cfg.int("spatial_merge_size", Some(2))?.pow(2);
    let out = cfg.int("out_hidden_size", Some(3584))?;
    let deepstack = match cfg.get("deepstack_visual_indexes") {
        Some(v) => v.as_array().map(Vec::len).ok_or_else(|| {
            cfg.bad("deepstack_visual_indexes", "expected a list of block indices")
        })? as u64,
        None => 3,
    };
    let block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d);
    let mlp = (merged * merged + merged) + (merged * out + out);
    let merger = 2 * d + mlp;
    let deepstack_merger = 2 * merged + mlp;
    Ok(d * channels * t * p * p
        + d
        + positions * d
        + depth * block
        + merger
        + deepstack * deepstack_merger)
}

/// Qwen3: GQA attention with per-head q/k RMS norms, no biases; an LM head only when untied.
fn qwen3(cfg: &Json, causal_lm: bool) -> Result<u64, PlanError> {
    let m = Decoder::read(cfg)?;
    let hd = m.q / cfg.int("num_attention_heads", None)?;
    let tied = cfg.boolean("tie_word_embeddings", true)?;
    let head = if causal_lm && !tied { m.vocab * m.d } else { 0 };
    Ok(m.params(false, hd) + head)
}

/// Gemma-3's language model: the Qwen3-like stack (GQA, per-head q/k norms, no biases, a gated
/// MLP) with norms after attention and the MLP as well as before (four per layer).
fn gemma3(cfg: &Json) -> Result<u64, PlanError> {
    let m = Decoder::read(cfg)?;
    let hd = m.q / cfg.int("num_attention_heads", None)?;
    Ok(m.params(false, hd) + m.layers * 2 * m.d)
}
