//! A tiny random Gemma-3 text encoder (`Gemma3ForConditionalGeneration` with a one-layer SigLIP
//! tower, in the `config.json` and key layout of LTX-2's `text_encoder/`) and a small Gemma
//! tokenizer (byte-fallback BPE, `▁` for spaces, `<bos>` prepended, left padding), both loadable by
//! transformers, for tests and `make-tiny ltx2`.

use std::path::Path;

use flowtune_sampling::SampleRng;
use serde_json::json;
use tch::{Device, Kind, Tensor};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::models::bpe::{BpeTrainerBuilder, Merges, Vocab, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use super::{Gemma3TextConfig, Gemma3TextEncoder, LayerKind, Rope};
use crate::{write_json, ModelError};

/// Gemma's first ids: `<pad>` 0, `<eos>` 1, `<bos>` 2, `<unk>` 3, `<mask>` 4; the 256 byte
/// tokens `<0x00>`‥`<0xFF>` follow, then the trained pieces.
pub const SPECIAL_TOKENS: [&str; 5] = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"];

/// Sizes of the tiny text encoder.
#[derive(Debug, Clone)]
pub struct TinyGemma3Spec {
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub layers: usize,
    pub heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
    pub query_pre_attn_scalar: i64,
    pub sliding_window: i64,
    /// Every `sliding_window_pattern`-th layer is global, the others local.
    pub sliding_window_pattern: usize,
    pub rope_theta: f64,
    pub rope_local_base_freq: f64,
    /// Linear rotary scaling of the global layers (Gemma-3-12B's is 8).
    pub rope_linear_factor: f64,
    /// BPE pieces trained on a built-in corpus, after the specials and the 256 byte tokens.
    pub bpe_pieces: usize,
    /// Width of the one-layer SigLIP tower (written so that the checkpoint is complete).
    pub vision_hidden_size: i64,
}

impl Default for TinyGemma3Spec {
    fn default() -> Self {
        Self {
            hidden_size: 32,
            intermediate_size: 48,
            layers: 3,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            query_pre_attn_scalar: 24,
            sliding_window: 4,
            sliding_window_pattern: 2,
            rope_theta: 1e6,
            rope_local_base_freq: 1e4,
            rope_linear_factor: 8.0,
            bpe_pieces: 200,
            vision_hidden_size: 8,
        }
    }
}

const CORPUS: &[&str] = &[
    "a red circle next to a blue square",
    "Two cats sitting on a mat in the morning light, photo, cinematic",
    "A woman walks through a rainy neon street at night, the camera follows her slowly",
    "waves crash on the shore while seagulls call, sound of wind",
    "the quick brown fox jumps over the lazy dog 0123456789",
];

fn io_err(path: &Path, e: impl std::fmt::Display) -> ModelError {
    ModelError::Io { path: path.display().to_string(), message: e.to_string() }
}

fn build_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Input(format!("building a tiny Gemma tokenizer: {e}"))
}

/// Gemma's pipeline around `bpe`: spaces become `▁`, splits after each space (a no-op after the
/// normalizer, kept as transformers builds it), bytes decoded from `<0x..>` tokens.
fn with_gemma_pipeline(bpe: BPE) -> Result<Tokenizer, ModelError> {
    let mut tok = Tokenizer::new(bpe);
    tok.with_normalizer(Some(Replace::new(" ", "▁").map_err(build_err)?));
    tok.with_pre_tokenizer(Some(
        Split::new(
            SplitPattern::String(" ".into()),
            SplitDelimiterBehavior::MergedWithPrevious,
            false,
        )
        .map_err(build_err)?,
    ));
    tok.with_decoder(Some(DecoderSequence::new(vec![
        Replace::new("▁", " ").map_err(build_err)?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ])));
    Ok(tok)
}

/// Trains `pieces` BPE pieces on [`CORPUS`] and returns the Gemma-layout tokenizer: specials,
/// byte tokens, pieces; `<bos>` before each text.
pub fn tiny_gemma_tokenizer(pieces: usize) -> Result<Tokenizer, ModelError> {
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(pieces)
        .min_frequency(1)
        .show_progress(false)
        .build()
        .into();
    let mut trained = with_gemma_pipeline(BPE::default())?;
    trained.train(&mut trainer, CORPUS.iter().copied()).map_err(build_err)?;
    let model: serde_json::Value =
        serde_json::from_str(&trained.to_string(false).map_err(build_err)?).expect("JSON");
    let mut learned: Vec<(String, u64)> = model["model"]["vocab"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(piece, id)| (piece.clone(), id.as_u64().unwrap_or(0)))
        .collect();
    learned.sort_by_key(|(_, id)| *id);
    let mut vocab = Vocab::new();
    let bytes = (0..=255u8).map(|b| format!("<0x{b:02X}>"));
    let names = SPECIAL_TOKENS.iter().map(|s| s.to_string()).chain(bytes);
    for name in names.chain(learned.into_iter().map(|(piece, _)| piece)) {
        let id = vocab.len() as u32;
        vocab.entry(name).or_insert(id);
    }
    let merges: Merges = model["model"]["merges"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| match m {
            serde_json::Value::Array(pair) => {
                Some((pair[0].as_str()?.to_string(), pair[1].as_str()?.to_string()))
            }
            other => {
                let (a, b) = other.as_str()?.split_once(' ')?;
                Some((a.to_string(), b.to_string()))
            }
        })
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .unk_token("<unk>".into())
        .fuse_unk(true)
        .byte_fallback(true)
        .build()
        .map_err(build_err)?;
    let mut tok = with_gemma_pipeline(bpe)?;
    let specials: Vec<AddedToken> =
        SPECIAL_TOKENS.iter().map(|t| AddedToken::from(*t, true).normalized(false)).collect();
    tok.add_special_tokens(&specials);
    tok.with_post_processor(Some(
        TemplateProcessing::builder()
            .try_single("<bos>:0 $A:0")
            .map_err(build_err)?
            .try_pair("<bos>:0 $A:0 <bos>:1 $B:1")
            .map_err(build_err)?
            .special_tokens(vec![("<bos>", 2)])
            .build()
            .map_err(build_err)?,
    ));
    Ok(tok)
}

/// Writes the tiny tokenizer (`tokenizer.json`, `tokenizer_config.json` of a `GemmaTokenizer`
/// padding on the left) into `dir`; returns its vocabulary size.
pub fn write_tiny_gemma_tokenizer(dir: &Path, pieces: usize) -> Result<i64, ModelError> {
    let tok = tiny_gemma_tokenizer(pieces)?;
    let decoder: serde_json::Map<String, serde_json::Value> = SPECIAL_TOKENS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let entry = json!({"content": t, "lstrip": false, "normalized": false,
                "rstrip": false, "single_word": false, "special": true});
            (i.to_string(), entry)
        })
        .collect();
    crate::tokenizer::tiny::write(
        dir,
        &tok,
        json!({
            "add_bos_token": true, "add_eos_token": false, "added_tokens_decoder": decoder,
            "bos_token": "<bos>", "clean_up_tokenization_spaces": false, "eos_token": "<eos>",
            "mask_token": "<mask>", "model_max_length": 1_000_000_000_000_000_019_884_624_838_656f64,
            "pad_token": "<pad>", "padding_side": "left", "spaces_between_special_tokens": false,
            "tokenizer_class": "GemmaTokenizer", "unk_token": "<unk>"
        }),
    )?;
    Ok(tok.get_vocab_size(true) as i64)
}

/// The text config of `spec` over `vocab_size` tokens.
pub fn tiny_gemma3_config(spec: &TinyGemma3Spec, vocab_size: i64) -> Gemma3TextConfig {
    let layer_types = (0..spec.layers)
        .map(|i| {
            if (i + 1) % spec.sliding_window_pattern == 0 {
                LayerKind::Full
            } else {
                LayerKind::Sliding
            }
        })
        .collect();
    Gemma3TextConfig {
        vocab_size,
        hidden_size: spec.hidden_size,
        intermediate_size: spec.intermediate_size,
        num_attention_heads: spec.heads,
        num_key_value_heads: spec.kv_heads,
        head_dim: spec.head_dim,
        rms_norm_eps: 1e-6,
        query_pre_attn_scalar: spec.query_pre_attn_scalar as f64,
        sliding_window: spec.sliding_window,
        layer_types,
        full_rope: Rope { theta: spec.rope_theta, factor: spec.rope_linear_factor },
        sliding_rope: Rope { theta: spec.rope_local_base_freq, factor: 1.0 },
    }
}

/// Writes `dir_text_encoder/{config.json, model.safetensors}` (keys `model.language_model.…`,
/// `model.vision_tower.…`, `model.multi_modal_projector.…`; `lm_head` tied, not stored) and the
/// tiny tokenizer into `dir_tokenizer`; weights are N(0, 0.1²) from `seed` (Gemma's norms scale
/// by 1 + w).
pub fn write_tiny_gemma3_text_encoder(
    dir_text_encoder: &Path,
    dir_tokenizer: &Path,
    seed: u64,
    spec: &TinyGemma3Spec,
) -> Result<(), ModelError> {
    let vocab_size = write_tiny_gemma_tokenizer(dir_tokenizer, spec.bpe_pieces)?;
    let config = tiny_gemma3_config(spec, vocab_size);
    let model = Gemma3TextEncoder::new(&config, Device::Cpu, Kind::Float);
    let mut named: Vec<(String, Tensor)> = model
        .store
        .variables()
        .into_iter()
        .map(|(name, t)| (format!("model.language_model.{name}"), t))
        .collect();
    let v = spec.vision_hidden_size;
    let tower = "model.vision_tower.vision_model";
    let layer = format!("{tower}.encoder.layers.0");
    let empty = |dims: &[i64]| Tensor::zeros(dims, (Kind::Float, Device::Cpu));
    let mut add = |name: String, dims: &[i64]| named.push((name, empty(dims)));
    add(format!("{tower}.embeddings.patch_embedding.weight"), &[v, 3, 14, 14]);
    add(format!("{tower}.embeddings.patch_embedding.bias"), &[v]);
    add(format!("{tower}.embeddings.position_embedding.weight"), &[4, v]);
    for norm in ["layer_norm1", "layer_norm2"] {
        add(format!("{layer}.{norm}.weight"), &[v]);
        add(format!("{layer}.{norm}.bias"), &[v]);
    }
    for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
        add(format!("{layer}.self_attn.{proj}.weight"), &[v, v]);
        add(format!("{layer}.self_attn.{proj}.bias"), &[v]);
    }
    for (fc, out, inp) in [("fc1", 2 * v, v), ("fc2", v, 2 * v)] {
        add(format!("{layer}.mlp.{fc}.weight"), &[out, inp]);
        add(format!("{layer}.mlp.{fc}.bias"), &[out]);
    }
    add(format!("{tower}.post_layernorm.weight"), &[v]);
    add(format!("{tower}.post_layernorm.bias"), &[v]);
    let projector = "model.multi_modal_projector";
    add(format!("{projector}.mm_input_projection_weight"), &[v, spec.hidden_size]);
    add(format!("{projector}.mm_soft_emb_norm.weight"), &[v]);

    named.sort_by(|a, b| a.0.cmp(&b.0));
    let mut rng = SampleRng::new(seed);
    let named: Vec<(String, Tensor)> = named
        .into_iter()
        .map(|(name, t)| (name, rng.normal(&t.size(), Device::Cpu) * 0.1))
        .collect();
    std::fs::create_dir_all(dir_text_encoder).map_err(|e| io_err(dir_text_encoder, e))?;
    let file = dir_text_encoder.join("model.safetensors");
    Tensor::write_safetensors(&named, &file).map_err(|e| io_err(&file, e))?;
    write_json(&dir_text_encoder.join("config.json"), &config_json(spec, vocab_size))
}

/// LTX-2's `text_encoder/config.json` layout (transformers 4.5x: flat rotary fields and
/// `sliding_window_pattern`) at the tiny sizes.
fn config_json(spec: &TinyGemma3Spec, vocab_size: i64) -> serde_json::Value {
    json!({
        "architectures": ["Gemma3ForConditionalGeneration"],
        "boi_token_index": vocab_size - 2,
        "eoi_token_index": vocab_size - 1,
        "eos_token_id": [1, 106],
        "image_token_index": vocab_size,
        "initializer_range": 0.02,
        "mm_tokens_per_image": 1,
        "model_type": "gemma3",
        "text_config": {
            "attention_bias": false,
            "attention_dropout": 0.0,
            "attn_logit_softcapping": null,
            "final_logit_softcapping": null,
            "head_dim": spec.head_dim,
            "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": spec.hidden_size,
            "initializer_range": 0.02,
            "intermediate_size": spec.intermediate_size,
            "max_position_embeddings": 131072,
            "model_type": "gemma3_text",
            "num_attention_heads": spec.heads,
            "num_hidden_layers": spec.layers,
            "num_key_value_heads": spec.kv_heads,
            "query_pre_attn_scalar": spec.query_pre_attn_scalar,
            "rms_norm_eps": 1e-6,
            "rope_local_base_freq": spec.rope_local_base_freq,
            "rope_scaling": {"factor": spec.rope_linear_factor, "rope_type": "linear"},
            "rope_theta": spec.rope_theta,
            "sliding_window": spec.sliding_window,
            "sliding_window_pattern": spec.sliding_window_pattern,
            "use_cache": true,
            "vocab_size": vocab_size
        },
        "torch_dtype": "float32",
        "transformers_version": "4.53.0",
        "vision_config": {
            "hidden_size": spec.vision_hidden_size,
            "image_size": 28,
            "intermediate_size": 2 * spec.vision_hidden_size,
            "layer_norm_eps": 1e-6,
            "model_type": "siglip_vision_model",
            "num_attention_heads": 2,
            "num_channels": 3,
            "num_hidden_layers": 1,
            "patch_size": 14,
            "vision_use_head": false
        }
    })
}
