//! A tiny random Qwen-Image text encoder (`Qwen2_5_VLForConditionalGeneration` with a one-block
//! vision tower, the flat `config.json` and key layout of `Qwen/Qwen-Image`) and a small Qwen2
//! tokenizer, loadable by transformers and diffusers, for tests.

use std::path::Path;

use flowtune_sampling::SampleRng;
use serde_json::json;
use tch::{Device, Kind, Tensor};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;

use super::qwen2_5_vl::{Qwen25VlTextConfig, Qwen25VlTextEncoder};
use super::qwen_prompts::PROMPT_TEMPLATE;
use crate::tokenizer::qwen2::{self, ADDED_TOKENS, NON_SPECIAL_ADDED};
use crate::{write_json, ModelError};

/// Sizes of the tiny text encoder.
#[derive(Debug, Clone)]
pub struct TinyQwenTextSpec {
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub layers: usize,
    pub heads: i64,
    pub kv_heads: i64,
    pub rope_theta: f64,
    /// Byte-level BPE vocabulary trained on a built-in corpus (≥ 256), before the added tokens.
    pub bpe_vocab_size: usize,
    /// Width of the one-block vision tower (written so that the checkpoint is complete).
    pub vision_hidden_size: i64,
}

impl Default for TinyQwenTextSpec {
    fn default() -> Self {
        Self {
            hidden_size: 32,
            intermediate_size: 48,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            rope_theta: 1e6,
            bpe_vocab_size: 400,
            vision_hidden_size: 16,
        }
    }
}

pub(crate) const CORPUS: &[&str] = &[
    "a red circle next to a blue square",
    "Two cats sitting on a mat in the morning light, photo, cinematic",
    "A neon sign that reads \"OPEN\" in a rainy street at night",
    "一只猫坐在垫子上，海报上写着欢迎光临",
    "the quick brown fox jumps over the lazy dog 0123456789",
];

fn io_err(path: &Path, e: impl std::fmt::Display) -> ModelError {
    ModelError::Io { path: path.display().to_string(), message: e.to_string() }
}

/// Writes `dir_text_encoder/{config.json, model.safetensors}` and `dir_tokenizer/{tokenizer.json,
/// vocab.json, merges.txt, tokenizer_config.json}`; weights are N(0, 0.1²) (norm scales around 1)
/// from `seed`.
pub fn write_tiny_qwen_text_encoder(
    dir_text_encoder: &Path,
    dir_tokenizer: &Path,
    seed: u64,
    spec: &TinyQwenTextSpec,
) -> Result<(), ModelError> {
    let base_vocab = write_tokenizer(dir_tokenizer, spec.bpe_vocab_size)?;
    let config = Qwen25VlTextConfig {
        vocab_size: (base_vocab + ADDED_TOKENS.len()) as i64,
        hidden_size: spec.hidden_size,
        intermediate_size: spec.intermediate_size,
        num_hidden_layers: spec.layers,
        num_attention_heads: spec.heads,
        num_key_value_heads: spec.kv_heads,
        rms_norm_eps: 1e-6,
        rope_theta: spec.rope_theta,
        mrope_section: Some(tiny_mrope_section(spec.hidden_size / spec.heads / 2)),
        image_token_id: (base_vocab + 12) as i64,
    };
    let model = Qwen25VlTextEncoder::new(&config, Device::Cpu, Kind::Float);
    let root = model.store.root();
    let (h, vi) = (spec.vision_hidden_size, spec.vision_hidden_size * 3 / 2);
    let merged = h * 4; // spatial_merge_size 2
    let visual = &root / "visual";
    let block = &(&visual / "blocks") / 0;
    let var = |path: tch::nn::Path<'_>, name: &str, dims: &[i64]| {
        let _ = path.var(name, dims, tch::nn::Init::Const(0.0));
    };
    var(&visual / "patch_embed" / "proj", "weight", &[h, 3, 2, 14, 14]);
    var(&block / "norm1", "weight", &[h]);
    var(&block / "norm2", "weight", &[h]);
    for (name, out, inp) in [("qkv", 3 * h, h), ("proj", h, h)] {
        var(&block / "attn" / name, "weight", &[out, inp]);
        var(&block / "attn" / name, "bias", &[out]);
    }
    for (name, out, inp) in [("gate_proj", vi, h), ("up_proj", vi, h), ("down_proj", h, vi)] {
        var(&block / "mlp" / name, "weight", &[out, inp]);
        var(&block / "mlp" / name, "bias", &[out]);
    }
    var(&visual / "merger" / "ln_q", "weight", &[h]);
    for (name, out, inp) in [("0", merged, merged), ("2", spec.hidden_size, merged)] {
        var(&visual / "merger" / "mlp" / name, "weight", &[out, inp]);
        var(&visual / "merger" / "mlp" / name, "bias", &[out]);
    }
    var(&root / "lm_head", "weight", &[config.vocab_size, spec.hidden_size]);

    let mut rng = SampleRng::new(seed);
    let mut named: Vec<(String, Tensor)> = model.store.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    let named: Vec<(String, Tensor)> = named
        .into_iter()
        .map(|(name, var)| {
            let noise = rng.normal(&var.size(), Device::Cpu) * 0.1;
            let is_scale = var.dim() == 1 && (name.contains("norm") || name.contains("ln_q"));
            (name, if is_scale { noise + 1.0 } else { noise })
        })
        .collect();
    std::fs::create_dir_all(dir_text_encoder).map_err(|e| io_err(dir_text_encoder, e))?;
    let file = dir_text_encoder.join("model.safetensors");
    Tensor::write_safetensors(&named, &file).map_err(|e| io_err(&file, e))?;
    write_json(&dir_text_encoder.join("config.json"), &flat_config(&config, spec, base_vocab))
}

/// `mrope_section` for `half` rotary frequencies: a quarter temporal, the rest split in two.
fn tiny_mrope_section(half: i64) -> Vec<i64> {
    let t = half / 4;
    let hgt = (half - t) / 2;
    vec![t, hgt, half - t - hgt]
}

/// The flat `config.json` layout of `Qwen/Qwen-Image`'s text encoder.
fn flat_config(c: &Qwen25VlTextConfig, spec: &TinyQwenTextSpec, base: usize) -> serde_json::Value {
    json!({
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "attention_dropout": 0.0,
        "bos_token_id": base,
        "eos_token_id": base + 2,
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "image_token_id": c.image_token_id,
        "initializer_range": 0.02,
        "intermediate_size": c.intermediate_size,
        "max_position_embeddings": 128000,
        "max_window_layers": c.num_hidden_layers,
        "model_type": "qwen2_5_vl",
        "num_attention_heads": c.num_attention_heads,
        "num_hidden_layers": c.num_hidden_layers,
        "num_key_value_heads": c.num_key_value_heads,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_scaling": {"mrope_section": c.mrope_section, "rope_type": "default", "type": "default"},
        "rope_theta": c.rope_theta,
        "sliding_window": 32768,
        "tie_word_embeddings": false,
        "torch_dtype": "float32",
        "transformers_version": "4.53.1",
        "use_cache": true,
        "use_sliding_window": false,
        "video_token_id": base + 13,
        "vision_config": {
            "depth": 1,
            "fullatt_block_indexes": [0],
            "hidden_act": "silu",
            "hidden_size": spec.vision_hidden_size,
            "in_channels": 3,
            "intermediate_size": spec.vision_hidden_size * 3 / 2,
            "model_type": "qwen2_5_vl",
            "num_heads": 2,
            "out_hidden_size": c.hidden_size,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "tokens_per_second": 2,
            "window_size": 112
        },
        "vision_end_token_id": base + 10,
        "vision_start_token_id": base + 9,
        "vision_token_id": base + 11,
        "vocab_size": c.vocab_size
    })
}

/// Trains a byte-level BPE of `vocab_size` on [`CORPUS`] and the template, writes it in both
/// layouts, and returns its size before the added tokens.
pub(crate) fn write_tokenizer(dir: &Path, vocab_size: usize) -> Result<usize, ModelError> {
    let build = |e: tokenizers::Error| ModelError::Input(format!("training a tiny tokenizer: {e}"));
    let mut tok = qwen2::with_bpe(BPE::default())?;
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(1)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    let corpus = CORPUS.iter().copied().chain([PROMPT_TEMPLATE]);
    tok.train(&mut trainer, corpus).map_err(build)?;
    let model: serde_json::Value =
        serde_json::from_str(&tok.to_string(false).map_err(build)?).expect("tokenizer JSON");
    let vocab = &model["model"]["vocab"];
    let merges: Vec<String> = model["model"]["merges"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| match m {
            serde_json::Value::Array(pair) => {
                pair.iter().filter_map(|p| p.as_str()).collect::<Vec<_>>().join(" ")
            }
            other => other.as_str().unwrap_or_default().to_string(),
        })
        .collect();
    let base = vocab.as_object().map_or(0, |v| v.len());
    let specials: Vec<tokenizers::AddedToken> = ADDED_TOKENS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let special = i < ADDED_TOKENS.len() - NON_SPECIAL_ADDED;
            tokenizers::AddedToken::from(*t, special).normalized(false)
        })
        .collect();
    for token in specials {
        if token.special {
            tok.add_special_tokens(&[token]);
        } else {
            tok.add_tokens(&[token]);
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let file = dir.join("tokenizer.json");
    tok.save(&file, true).map_err(|e| io_err(&file, e))?;
    write_json(&dir.join("vocab.json"), vocab)?;
    let merges_file = dir.join("merges.txt");
    let text = format!("#version: 0.2\n{}\n", merges.join("\n"));
    std::fs::write(&merges_file, text).map_err(|e| io_err(&merges_file, e))?;
    let decoder: serde_json::Map<String, serde_json::Value> = ADDED_TOKENS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let special = i < ADDED_TOKENS.len() - NON_SPECIAL_ADDED;
            let entry = json!({"content": t, "lstrip": false, "normalized": false,
                "rstrip": false, "single_word": false, "special": special});
            ((base + i).to_string(), entry)
        })
        .collect();
    let specials = &ADDED_TOKENS[1..ADDED_TOKENS.len() - NON_SPECIAL_ADDED];
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({
            "add_bos_token": false, "add_prefix_space": false, "added_tokens_decoder": decoder,
            "additional_special_tokens": specials, "bos_token": null,
            "clean_up_tokenization_spaces": false, "eos_token": "<|im_end|>", "errors": "replace",
            "model_max_length": 32768, "pad_token": "<|endoftext|>", "split_special_tokens": false,
            "tokenizer_class": "Qwen2Tokenizer", "unk_token": null
        }),
    )?;
    Ok(base)
}
