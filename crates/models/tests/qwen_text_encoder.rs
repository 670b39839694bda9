//! Qwen-Image's text encoder against transformers/diffusers (`scripts/reference_qwen_text.py`):
//! Qwen2.5-VL hidden states, `QwenImagePipeline.encode_prompt`, and Qwen2 tokenizer ids on the
//! real vocabulary through both load paths (tokenizer.json; vocab.json + merges.txt).

use std::io::Read;
use std::path::{Path, PathBuf};

use flowtune_fixtures::{dir, json, scratch, tensors, Checker, Scratch};
use flowtune_models::text_encoders::qwen2_5_vl::Qwen25VlTextEncoder;
use flowtune_models::text_encoders::qwen_prompts::{QwenPromptEncoder, PROMPT_TEMPLATE};
use flowtune_models::tokenizer::TextTokenizer;
use flowtune_models::ModelError;
use tch::{Device, Kind, Tensor};

const MODELS: &[&str] = &["qwen_text_flat", "qwen_text_gqa"];
const PROMPT_CASES: &[(&str, &[&str], usize)] = &[
    ("mixed", &["a red circle", "Two BLUE squares, left of a triangle! 猫🐱 3.14", " ", "x"], 1024),
    ("truncated", &["a photo of a cat sitting on a mat, in the morning light", "dog"], 5),
    ("negative", &[" "], 1024),
];

fn copy(from: &Path, to: &Path, names: &[&str]) {
    for n in names {
        std::fs::copy(from.join(n), to.join(n)).unwrap_or_else(|e| panic!("copy {n}: {e}"));
    }
}

fn gunzip(file: &Path) -> String {
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(file).expect("open gz"))
        .read_to_string(&mut text)
        .expect("gunzip");
    text
}

#[test]
fn hidden_states_match_transformers() {
    let mut check = Checker::new("qwen_text_*_io.safetensors hidden states");
    for name in MODELS {
        check.case();
        let io = tensors(&format!("{name}_io.safetensors"));
        let model =
            Qwen25VlTextEncoder::load(&dir().join(name), Device::Cpu, Kind::Float).expect("load");
        let out =
            tch::no_grad(|| model.forward(&io["input.input_ids"], &io["input.attention_mask"]))
                .expect("forward");
        check.close(&format!("{name} output.hidden_states"), &out, &io["output.hidden_states"]);
    }
    check.finish();
}

/// The tiny tokenizer as transformers saved it, and as vocab.json + merges.txt only (in the
/// scratch folder returned beside them).
fn tiny_tokenizer_dirs() -> (Vec<(&'static str, PathBuf)>, Scratch) {
    let saved = dir().join("qwen_text_tiny_tokenizer");
    let files = scratch("tiny-vocab-merges");
    copy(&saved, &files, &["vocab.json", "merges.txt", "tokenizer_config.json"]);
    (vec![("tokenizer.json", saved), ("vocab+merges", files.to_path_buf())], files)
}

#[test]
fn prompt_embeds_match_diffusers() {
    let mut check = Checker::new("qwen_text_*_io.safetensors prompts.*");
    for name in MODELS {
        let io = tensors(&format!("{name}_io.safetensors"));
        let (dirs, _files) = tiny_tokenizer_dirs();
        for (path_name, tokenizer_dir) in dirs {
            let encoder = QwenPromptEncoder::load(
                &dir().join(name),
                &tokenizer_dir,
                Device::Cpu,
                Kind::Float,
            )
            .expect("load");
            for (case, prompts, max_len) in PROMPT_CASES {
                check.case();
                let what = format!("{name} {path_name} prompts.{case}");
                let texts: Vec<String> =
                    prompts.iter().map(|p| PROMPT_TEMPLATE.replace("{}", p)).collect();
                let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
                let (ids, _) = encoder.tokenizer.encode_longest(&texts, 1024 + 34).expect("ids");
                if ids != io[&format!("prompts.{case}.input_ids")] {
                    check.fail(format!("{what}: input ids differ from transformers'"));
                }
                let (embeds, mask) =
                    tch::no_grad(|| encoder.encode_prompts(prompts, *max_len)).expect("encode");
                let ref_mask = &io[&format!("prompts.{case}.mask")];
                if mask.size() != ref_mask.size() || mask != *ref_mask {
                    check.fail(format!(
                        "{what}: mask {:?} differs from diffusers' {:?}",
                        mask.size(),
                        ref_mask.size()
                    ));
                    continue;
                }
                check.close(
                    &format!("{what}.embeds"),
                    &embeds,
                    &io[&format!("prompts.{case}.embeds")],
                );
            }
        }
    }
    check.finish();
}

/// The real Qwen2 vocabulary in a scratch folder, once as vocab.json + merges.txt and once as the
/// tokenizer.json transformers writes (its pipeline from the fixture, vocabulary and merges
/// filled in from the same files).
fn real_tokenizer_dirs() -> Vec<(&'static str, Scratch)> {
    let fixture = dir().join("qwen_text_tokenizer");
    let vocab = gunzip(&fixture.join("vocab.json.gz"));
    let merges = gunzip(&fixture.join("merges.txt.gz"));
    let files = scratch("real-vocab-merges");
    std::fs::write(files.join("vocab.json"), &vocab).expect("write");
    std::fs::write(files.join("merges.txt"), &merges).expect("write");
    copy(&fixture, &files, &["tokenizer_config.json"]);

    let full = scratch("real-tokenizer-json");
    let mut pipeline = json("qwen_text_tokenizer/tokenizer_pipeline.json");
    pipeline["model"]["vocab"] = serde_json::from_str(&vocab).expect("vocab.json");
    pipeline["model"]["merges"] = merges
        .lines()
        .filter(|l| !l.starts_with("#version") && !l.is_empty())
        .map(|l| {
            let (a, b) = l.split_once(' ').expect("merge pair");
            serde_json::json!([a, b])
        })
        .collect();
    std::fs::write(full.join("tokenizer.json"), pipeline.to_string()).expect("write");
    copy(&fixture, &full, &["tokenizer_config.json"]);
    vec![("tokenizer.json", full), ("vocab+merges", files)]
}

#[test]
fn tokenizer_ids_match_transformers_on_the_real_vocabulary() {
    let cases = json("qwen_text_tokenizer_ids.json");
    let cases = cases.as_array().expect("list");
    assert!(cases.len() >= 200, "{} prompts", cases.len());
    for (path_name, tokenizer_dir) in real_tokenizer_dirs() {
        let tokenizer = TextTokenizer::load(&tokenizer_dir).expect("load tokenizer");
        let mut failures = vec![];
        for case in cases {
            let prompt = case["prompt"].as_str().expect("prompt");
            let expected: Vec<u32> = serde_json::from_value(case["ids"].clone()).expect("ids");
            let ids = tokenizer.ids(prompt).expect("encode");
            if ids != expected {
                failures.push(format!("{prompt:?}: {ids:?} != {expected:?}"));
            }
        }
        println!("{path_name}: {} prompts, {} differ", cases.len(), failures.len());
        assert!(failures.is_empty(), "{path_name}:\n{}", failures.join("\n"));
    }
}

#[test]
fn a_missing_tensor_is_named() {
    let source = dir().join("qwen_text_flat");
    let broken = scratch("missing-tensor");
    copy(&source, &broken, &["config.json"]);
    let kept: Vec<(String, Tensor)> = Tensor::read_safetensors(source.join("model.safetensors"))
        .expect("read")
        .into_iter()
        .filter(|(k, _)| k != "model.layers.1.mlp.up_proj.weight")
        .collect();
    Tensor::write_safetensors(&kept, broken.join("model.safetensors")).expect("write");
    match Qwen25VlTextEncoder::load(&broken, Device::Cpu, Kind::Float) {
        Err(e @ ModelError::Missing { .. }) => {
            let message = e.to_string();
            assert!(message.contains("model.layers.1.mlp.up_proj.weight"), "{message}");
        }
        Err(e) => panic!("expected a missing-tensor error, got {e}"),
        Ok(_) => panic!("a checkpoint without model.layers.1.mlp.up_proj.weight loaded"),
    }
}

#[test]
fn tiny_writer_loads_and_encodes() {
    use flowtune_models::text_encoders::qwen_tiny::{
        write_tiny_qwen_text_encoder, TinyQwenTextSpec,
    };
    let root = scratch("tiny-writer");
    let (te, tok) = (root.join("text_encoder"), root.join("tokenizer"));
    write_tiny_qwen_text_encoder(&te, &tok, 3, &TinyQwenTextSpec::default()).expect("write");
    let encoder = QwenPromptEncoder::load(&te, &tok, Device::Cpu, Kind::Float).expect("load");
    let (embeds, mask) =
        tch::no_grad(|| encoder.encode_prompts(&["a red circle", " "], 1024)).expect("encode");
    assert_eq!(embeds.size()[0], 2);
    assert_eq!(embeds.size()[2], 32);
    let lengths: Vec<i64> = Vec::try_from(mask.sum_dim_intlist(1, false, Kind::Int64)).unwrap();
    assert!(lengths[0] > lengths[1] && lengths[1] > 0, "{lengths:?}");
    // The vocab.json + merges.txt path gives the same ids as the tokenizer.json path.
    let files = scratch("tiny-writer-files");
    copy(&tok, &files, &["vocab.json", "merges.txt", "tokenizer_config.json"]);
    let from_files = TextTokenizer::load(&files).expect("load vocab+merges");
    let text = PROMPT_TEMPLATE.replace("{}", "猫 cat!");
    assert_eq!(from_files.ids(&text).unwrap(), encoder.tokenizer.ids(&text).unwrap());
}
