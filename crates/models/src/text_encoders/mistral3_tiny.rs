//! A tiny random FLUX.2 [dev] text encoder: `Mistral3ForConditionalGeneration` (the language
//! model, a one-layer Pixtral vision tower and its projector, `lm_head`, in transformers 5's key
//! layout) and a `PixtralProcessor` folder with a small Tekken-style byte-level BPE (Mistral's
//! control tokens at ids 0‥19, `<s>` added in front, left padding), loadable by transformers and
//! diffusers, for tests.

use std::path::Path;

use flowtune_sampling::SampleRng;
use serde_json::json;
use tch::{Device, Kind, Tensor};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::AddedToken;

use super::mistral3::Mistral3TextEncoder;
use super::qwen_decoder::DecoderShape;
use super::qwen_tiny::CORPUS;
use crate::sd3::tiny::randomize;
use crate::sd3::WeightInit;
use crate::tokenizer::qwen2;
use crate::{write_json, ModelError};

/// Mistral's control tokens, ids 0‥19 of the Tekken vocabulary.
const CONTROL_TOKENS: [&str; 20] = [
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
];
/// `[IMG]`'s id.
const IMAGE_TOKEN: usize = 10;

/// The part of Mistral Small 3's chat template that renders a system turn and user turns of text
/// blocks.
const CHAT_TEMPLATE: &str = "{{- bos_token }}{%- if messages[0]['role'] == 'system' %}{%- set \
    system_message = messages[0]['content'][0]['text'] %}{%- set loop_messages = messages[1:] \
    %}{%- else %}{%- set system_message = '' %}{%- set loop_messages = messages %}{%- endif \
    %}{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}{%- for message in \
    loop_messages %}{{- '[INST]' }}{%- for block in message['content'] %}{%- if block['type'] == \
    'text' %}{{- block['text'] }}{%- else %}{{- '[IMG]' }}{%- endif %}{%- endfor %}{{- '[/INST]' \
    }}{%- endfor %}";

/// Width of the one-layer vision tower.
const VISION: i64 = 16;

fn io_err(path: &Path, e: impl std::fmt::Display) -> ModelError {
    ModelError::Io { path: path.display().to_string(), message: e.to_string() }
}

/// Writes `dir/text_encoder` and `dir/tokenizer` for `text` (its vocabulary size is set from the
/// tokenizer's) and returns the shape written.
pub(crate) fn write_mistral3(
    dir: &Path,
    text: &DecoderShape,
    bpe_vocab_size: usize,
    system_message: &str,
    rng: &mut SampleRng,
) -> Result<DecoderShape, ModelError> {
    let vocab = write_tokenizer(&dir.join("tokenizer"), bpe_vocab_size, system_message)?;
    let text = DecoderShape { vocab_size: vocab as i64, ..text.clone() };
    let encoder = Mistral3TextEncoder::new(&text, None, Device::Cpu, Kind::Float);
    randomize(&encoder.store, rng, WeightInit::Normal(0.1))?;
    let mut tensors: Vec<(String, Tensor)> = encoder
        .store
        .variables()
        .into_iter()
        .map(|(name, t)| (format!("model.language_model.{name}"), t))
        .collect();
    let (h, v) = (text.hidden_size, VISION);
    let vision = [
        ("model.vision_tower.patch_conv.weight", vec![v, 3, 16, 16]),
        ("model.vision_tower.ln_pre.weight", vec![v]),
        ("model.multi_modal_projector.norm.weight", vec![v]),
        ("model.multi_modal_projector.patch_merger.merging_layer.weight", vec![v, 4 * v]),
        ("model.multi_modal_projector.linear_1.weight", vec![h, v]),
        ("model.multi_modal_projector.linear_2.weight", vec![h, h]),
        ("lm_head.weight", vec![text.vocab_size, h]),
    ];
    let layer = "model.vision_tower.transformer.layers.0";
    let blocks = [
        ("attention_norm.weight", vec![v]),
        ("ffn_norm.weight", vec![v]),
        ("feed_forward.gate_proj.weight", vec![24, v]),
        ("feed_forward.up_proj.weight", vec![24, v]),
        ("feed_forward.down_proj.weight", vec![v, 24]),
        ("attention.q_proj.weight", vec![v, v]),
        ("attention.k_proj.weight", vec![v, v]),
        ("attention.v_proj.weight", vec![v, v]),
        ("attention.o_proj.weight", vec![v, v]),
    ];
    let named = vision
        .into_iter()
        .map(|(n, s)| (n.to_string(), s))
        .chain(blocks.into_iter().map(|(n, s)| (format!("{layer}.{n}"), s)));
    for (name, shape) in named {
        let noise = rng.normal(&shape, Device::Cpu) * 0.1;
        tensors.push((name.clone(), if name.contains("norm") { noise + 1.0 } else { noise }));
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let out = dir.join("text_encoder");
    std::fs::create_dir_all(&out).map_err(|e| io_err(&out, e))?;
    let file = out.join("model.safetensors");
    Tensor::write_safetensors(&tensors, &file).map_err(|e| io_err(&file, e))?;
    write_json(&out.join("config.json"), &config(&text))?;
    Ok(text)
}

/// `config.json` of the `Mistral3ForConditionalGeneration`.
fn config(s: &DecoderShape) -> serde_json::Value {
    json!({
        "architectures": ["Mistral3ForConditionalGeneration"],
        "dtype": "float32",
        "image_token_index": IMAGE_TOKEN,
        "model_type": "mistral3",
        "multimodal_projector_bias": false,
        "projector_hidden_act": "gelu",
        "spatial_merge_size": 2,
        "text_config": {
            "attention_dropout": 0.0,
            "head_dim": s.head_dim,
            "hidden_act": "silu",
            "hidden_size": s.hidden_size,
            "intermediate_size": s.intermediate_size,
            "max_position_embeddings": 131072,
            "model_type": "mistral",
            "num_attention_heads": s.num_attention_heads,
            "num_hidden_layers": s.num_hidden_layers,
            "num_key_value_heads": s.num_key_value_heads,
            "rms_norm_eps": s.rms_norm_eps,
            "rope_parameters": {"rope_theta": s.rope_theta, "rope_type": "default"},
            "sliding_window": null,
            "tie_word_embeddings": false,
            "vocab_size": s.vocab_size
        },
        "tie_word_embeddings": false,
        "vision_config": {
            "head_dim": VISION / 2,
            "hidden_act": "gelu",
            "hidden_size": VISION,
            "image_size": 64,
            "intermediate_size": 24,
            "model_type": "pixtral",
            "num_attention_heads": 2,
            "num_channels": 3,
            "num_hidden_layers": 1,
            "patch_size": 16,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "axial"}
        },
        "vision_feature_layer": -1
    })
}

/// Trains a byte-level BPE of `vocab_size` (control tokens included) on the corpus and
/// `system_message`, writes the processor folder, and returns the vocabulary size.
fn write_tokenizer(
    dir: &Path,
    vocab_size: usize,
    system_message: &str,
) -> Result<usize, ModelError> {
    let build = |e: tokenizers::Error| ModelError::Input(format!("training a tiny tokenizer: {e}"));
    let mut tok = qwen2::with_bpe(BPE::default())?;
    let controls: Vec<AddedToken> =
        CONTROL_TOKENS.iter().map(|t| AddedToken::from(*t, true).normalized(false)).collect();
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(1)
        .show_progress(false)
        .special_tokens(controls.clone())
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    let corpus = CORPUS.iter().copied().chain([system_message]);
    tok.train(&mut trainer, corpus).map_err(build)?;
    tok.add_special_tokens(&controls);
    tok.with_post_processor(Some(
        TemplateProcessing::builder()
            .try_single("<s> $A")
            .map_err(|e| ModelError::Input(format!("tiny tokenizer template: {e}")))?
            .special_tokens(vec![("<s>", 1)])
            .build()
            .map_err(|e| ModelError::Input(format!("tiny tokenizer template: {e}")))?,
    ));
    let size = tok.get_vocab_size(true);
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let file = dir.join("tokenizer.json");
    tok.save(&file, true).map_err(|e| io_err(&file, e))?;
    let file = dir.join("chat_template.jinja");
    std::fs::write(&file, CHAT_TEMPLATE).map_err(|e| io_err(&file, e))?;
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({
            "bos_token": "<s>", "clean_up_tokenization_spaces": false, "eos_token": "</s>",
            "model_max_length": 131072, "pad_token": "<pad>", "padding_side": "left",
            "processor_class": "PixtralProcessor", "tokenizer_class": "TokenizersBackend",
            "unk_token": "<unk>"
        }),
    )?;
    write_json(
        &dir.join("processor_config.json"),
        &json!({
            "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]",
            "image_token": "[IMG]", "patch_size": 16, "processor_class": "PixtralProcessor",
            "spatial_merge_size": 2
        }),
    )?;
    write_json(
        &dir.join("preprocessor_config.json"),
        &json!({
            "do_convert_rgb": true, "do_normalize": true, "do_rescale": true, "do_resize": true,
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_processor_type": "PixtralImageProcessor",
            "image_std": [0.26862954, 0.26130258, 0.27577711],
            "patch_size": {"height": 16, "width": 16}, "processor_class": "PixtralProcessor",
            "resample": 3, "rescale_factor": 0.00392156862745098,
            "size": {"longest_edge": 1540}
        }),
    )?;
    Ok(size)
}
