//! Z-Image's text encoder against transformers/diffusers (`scripts/reference_qwen3_text.py`):
//! Qwen3 `hidden_states[-2]` for a `Qwen3Model` and a `Qwen3ForCausalLM` checkpoint,
//! `ZImagePipeline._encode_prompt` (chat template, valid tokens, truncation), and the ids of
//! chat-templated prompts on the real Qwen vocabulary.

use std::io::Read;

use flowtune_fixtures::{dir, json, tensors, Checker};
use flowtune_models::text_encoders::qwen3::Qwen3TextEncoder;
use flowtune_models::tokenizer::TextTokenizer;
use flowtune_models::z_image::{ZImagePromptEncoder, CHAT_TEMPLATE};
use tch::{Device, Kind};

const MODELS: &[&str] = &["qwen3_text_tiny", "qwen3_text_causal"];
const PROMPT_CASES: &[(&str, &[&str], usize)] = &[
    ("mixed", &["a red circle", "Two BLUE squares, left of a triangle! 猫🐱 3.14", "", "x"], 512),
    ("truncated", &["a photo of a cat sitting on a mat, in the morning light", "dog"], 12),
];

#[test]
fn penultimate_hidden_states_match_transformers() {
    let mut check = Checker::new("qwen3_text_*_io.safetensors hidden_states[-2]");
    for name in MODELS {
        check.case();
        let io = tensors(&format!("{name}_io.safetensors"));
        let model =
            Qwen3TextEncoder::load(&dir().join(name), Device::Cpu, Kind::Float).expect("load");
        let out =
            tch::no_grad(|| model.penultimate(&io["input.input_ids"], &io["input.attention_mask"]))
                .expect("forward");
        check.close(&format!("{name} hidden_states[-2]"), &out, &io["output.hidden_states_m2"]);
    }
    check.finish();
}

#[test]
fn prompt_embeds_match_diffusers() {
    let mut check = Checker::new("qwen3_text_*_io.safetensors prompts.*");
    let tokenizer = dir().join("qwen_text_tiny_tokenizer");
    for name in MODELS {
        let io = tensors(&format!("{name}_io.safetensors"));
        let encoder =
            ZImagePromptEncoder::load(&dir().join(name), &tokenizer, Device::Cpu, Kind::Float)
                .expect("load");
        for (case, prompts, max_len) in PROMPT_CASES {
            check.case();
            let what = format!("{name} prompts.{case}");
            let (embeds, mask) =
                tch::no_grad(|| encoder.encode(prompts, *max_len)).expect("encode");
            let ref_mask = &io[&format!("prompts.{case}.mask")];
            if mask != *ref_mask {
                check.fail(format!("{what}: mask {mask:?} differs from diffusers' {ref_mask:?}"));
                continue;
            }
            check.close(&format!("{what}.embeds"), &embeds, &io[&format!("prompts.{case}.embeds")]);
        }
    }
    check.finish();
}

fn gunzip(file: &std::path::Path) -> String {
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(file).expect("open gz"))
        .read_to_string(&mut text)
        .expect("gunzip");
    text
}

/// The real Qwen vocabulary as vocab.json + merges.txt in a scratch folder.
fn real_tokenizer_dir() -> flowtune_fixtures::Scratch {
    let fixture = dir().join("qwen_text_tokenizer");
    let d = flowtune_fixtures::scratch("qwen3-tok");
    std::fs::write(d.join("vocab.json"), gunzip(&fixture.join("vocab.json.gz"))).unwrap();
    std::fs::write(d.join("merges.txt"), gunzip(&fixture.join("merges.txt.gz"))).unwrap();
    std::fs::copy(fixture.join("tokenizer_config.json"), d.join("tokenizer_config.json")).unwrap();
    d
}

#[test]
fn chat_templated_ids_match_transformers_on_the_real_vocabulary() {
    let cases = json("qwen3_text_tokenizer_ids.json");
    let cases = cases.as_array().expect("list");
    assert!(cases.len() >= 200, "{} prompts", cases.len());
    let tokenizer = TextTokenizer::load(&real_tokenizer_dir()).expect("load tokenizer");
    let mut failures = vec![];
    for case in cases {
        let prompt = case["prompt"].as_str().expect("prompt");
        let text = CHAT_TEMPLATE.replace("{}", prompt);
        if text != case["text"].as_str().expect("text") {
            failures.push(format!(
                "{prompt:?}: template gives {text:?}, transformers {}",
                case["text"]
            ));
            continue;
        }
        let expected: Vec<u32> = serde_json::from_value(case["ids"].clone()).expect("ids");
        let ids = tokenizer.ids(&text).expect("encode");
        if ids != expected {
            failures.push(format!("{prompt:?}: {ids:?} != {expected:?}"));
        }
    }
    println!("{} chat-templated prompts, {} differ", cases.len(), failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
