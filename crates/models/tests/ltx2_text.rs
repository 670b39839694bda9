//! LTX-2's text path against transformers/diffusers (`scripts/reference_ltx2_text.py`): every
//! Gemma-3 hidden state of left-padded ids (local and global layers, GQA, a small window),
//! tokenizer ids, `_get_gemma_prompt_embeds` and `LTX2TextConnectors` for LTX-2.0- and
//! LTX-2.3-style configs; the tiny writers reproduce the fixture models; bad configs are refused.

use std::path::Path;

use flowtune_fixtures::{dir, json, models_of_kind, scratch, tensors, Checker};
use flowtune_models::ltx2::connectors::{
    write_tiny_ltx2_connectors, Ltx2ConnectorsConfig, Ltx2TextConnectors, PaddingSide,
};
use flowtune_models::text_encoders::gemma3::prompts::Gemma3PromptEncoder;
use flowtune_models::text_encoders::gemma3::tiny::{
    write_tiny_gemma3_text_encoder, TinyGemma3Spec,
};
use flowtune_models::text_encoders::gemma3::{Gemma3TextConfig, Gemma3TextEncoder, LayerKind};
use flowtune_models::tokenizer::TextTokenizer;
use tch::{Device, Kind, Tensor};

/// Relative error allowed (f32, CPU).
const RTOL: f64 = 1e-5;
const CASES: &[(&str, &[&str], usize)] = &[
    ("mixed", &["a red circle", "  Two cats sitting on a mat, 猫🐱 at night!  ", "x"], 16),
    (
        "truncated",
        &[
            "A woman walks through a rainy neon street at night, the camera follows her",
            "",
            "\u{3000}\u{1f}café\u{1c}\n",
        ],
        8,
    ),
];
const CONNECTORS: &[&str] = &["connectors_ltx20", "connectors_ltx23"];

fn tiny_dir() -> std::path::PathBuf {
    dir().join("ltx2_text_tiny")
}

/// The tiny text encoder, tokenizer and both connectors, as the fixtures hold them.
fn write_models(root: &Path) {
    let spec = TinyGemma3Spec::default();
    write_tiny_gemma3_text_encoder(&root.join("text_encoder"), &root.join("tokenizer"), 7, &spec)
        .expect("write the text encoder");
    let factor = spec.layers as i64 + 1;
    for (i, name) in CONNECTORS.iter().enumerate() {
        let config = Ltx2ConnectorsConfig::tiny(spec.hidden_size, factor, i == 1);
        write_tiny_ltx2_connectors(&root.join(name), 8 + i as u64, &config).expect("write");
    }
}

/// Rewrites the fixture models (then run the reference script).
#[test]
#[ignore]
fn write_fixture_models() {
    write_models(&tiny_dir());
}

#[test]
fn writers_reproduce_the_fixture_models() {
    let fresh = scratch("ltx2-text-writers");
    write_models(&fresh);
    let files = [
        "text_encoder/config.json",
        "text_encoder/model.safetensors",
        "tokenizer/tokenizer.json",
        "tokenizer/tokenizer_config.json",
        "connectors_ltx20/config.json",
        "connectors_ltx20/diffusion_pytorch_model.safetensors",
        "connectors_ltx23/config.json",
        "connectors_ltx23/diffusion_pytorch_model.safetensors",
    ];
    for file in files {
        let (a, b) = (std::fs::read(fresh.join(file)), std::fs::read(tiny_dir().join(file)));
        assert!(a.unwrap() == b.unwrap(), "{file} differs from the fixture");
    }
}

#[test]
fn hidden_states_match_transformers() {
    let io = tensors("ltx2_text_io.safetensors");
    let entries = models_of_kind("ltx2_gemma3");
    assert_eq!(entries.len(), 1, "{entries:?}");
    let weights = dir().join(entries[0]["model"].as_str().expect("model"));
    let configs = entries[0]["configs"].as_array().expect("configs");
    assert!(configs.len() >= 2, "{configs:?}");
    let mut check = Checker::new("ltx2_text_io.safetensors gemma3.hidden_states.*");
    for config in configs {
        check.case();
        // The checkpoint under each config layout (transformers 4's flat rotary fields and
        // `sliding_window_pattern`, transformers 5's `rope_parameters` and `layer_types`).
        let config = config.as_str().expect("config path");
        let model_dir = scratch("ltx2-gemma3-config");
        std::fs::copy(dir().join(config), model_dir.join("config.json")).unwrap();
        std::fs::copy(weights.join("model.safetensors"), model_dir.join("model.safetensors"))
            .unwrap();
        let model = Gemma3TextEncoder::load(&model_dir, Device::Cpu, Kind::Float).expect("load");
        let kinds = &model.config.layer_types;
        assert!(kinds.len() == 3 && kinds[0] != kinds[1], "{kinds:?}");
        assert_eq!(model.config.full_rope.factor, 8.0);
        let states = tch::no_grad(|| {
            model.hidden_states(&io["gemma3.input_ids"], &io["gemma3.attention_mask"])
        })
        .expect("forward");
        assert_eq!(states.len(), model.num_layers() + 1);
        for (k, state) in states.iter().enumerate() {
            let reference = &io[&format!("gemma3.hidden_states.{k}")];
            check.close_within(&format!("{config} hidden_states[{k}]"), state, reference, RTOL);
        }
    }
    check.finish();
}

#[test]
fn tokenizer_ids_match_transformers() {
    let tokenizer = TextTokenizer::load(&tiny_dir().join("tokenizer")).expect("tokenizer");
    let cases = json("ltx2_text_tokenizer_ids.json");
    let cases = cases.as_array().expect("list");
    assert!(cases.len() >= 5);
    for case in cases {
        let prompt = case["prompt"].as_str().expect("prompt");
        let expected: Vec<u32> = serde_json::from_value(case["ids"].clone()).expect("ids");
        assert_eq!(tokenizer.ids(prompt).expect("ids"), expected, "{prompt:?}");
    }
}

#[test]
fn prompt_embeds_and_connectors_match_diffusers() {
    let io = tensors("ltx2_text_io.safetensors");
    let root = tiny_dir();
    let encoder = Gemma3PromptEncoder::load(
        &root.join("text_encoder"),
        &root.join("tokenizer"),
        Device::Cpu,
        Kind::Float,
    )
    .expect("load");
    let entries = models_of_kind("ltx2_connectors");
    assert_eq!(entries.len(), CONNECTORS.len(), "{entries:?}");
    let connectors: Vec<(&str, Ltx2TextConnectors)> = CONNECTORS
        .iter()
        .map(|name| {
            let model = Ltx2TextConnectors::load(&root.join(name), Device::Cpu, Kind::Float);
            (*name, model.expect("load connectors"))
        })
        .collect();
    let mut check = Checker::new("ltx2_text_io.safetensors prompts.* / right.*");
    for (case, prompts, length) in CASES {
        check.case();
        let what = format!("prompts.{case}");
        let (ids, mask) = encoder.tokenize(prompts, *length).expect("tokenize");
        assert_eq!(ids, io[&format!("{what}.input_ids")], "{what} ids");
        assert_eq!(mask, io[&format!("{what}.mask")], "{what} mask");
        let (embeds, mask) = tch::no_grad(|| encoder.encode(prompts, *length)).expect("encode");
        check.close_within(
            &format!("{what}.embeds"),
            &embeds,
            &io[&format!("{what}.embeds")],
            RTOL,
        );
        for (name, model) in &connectors {
            let out =
                tch::no_grad(|| model.forward(&embeds, &mask, PaddingSide::Left)).expect("run");
            compare(&mut check, &io, &format!("{what}.{name}"), &out);
            let out = tch::no_grad(|| model.encode_prompts(&encoder, prompts, *length))
                .expect("encode_prompts");
            compare(&mut check, &io, &format!("{what}.{name}"), &out);
        }
    }
    check.case();
    for (name, model) in &connectors {
        let (embeds, mask) = (&io["right.embeds"], &io["right.mask"]);
        let out = tch::no_grad(|| model.forward(embeds, mask, PaddingSide::Right)).expect("run");
        compare(&mut check, &io, &format!("right.{name}"), &out);
    }
    check.finish();
}

fn compare(
    check: &mut Checker,
    io: &std::collections::HashMap<String, Tensor>,
    what: &str,
    out: &flowtune_models::ltx2::connectors::ConnectorOutput,
) {
    check.close_within(&format!("{what}.video"), &out.video, &io[&format!("{what}.video")], RTOL);
    check.close_within(&format!("{what}.audio"), &out.audio, &io[&format!("{what}.audio")], RTOL);
    let reference = &io[&format!("{what}.mask")];
    if out.mask != *reference {
        check.fail(format!("{what}.mask: {:?} differs from diffusers' {reference:?}", out.mask));
    }
}

/// `file` of the fixture model `model` with `edit` applied to its JSON, in a scratch folder.
fn edited(
    model: &str,
    file: &str,
    edit: impl Fn(&mut serde_json::Value),
) -> flowtune_fixtures::Scratch {
    let out = scratch("ltx2-text-refused");
    let mut value = json(&format!("ltx2_text_tiny/{model}/{file}"));
    edit(&mut value);
    std::fs::write(out.join(file), serde_json::to_string(&value).unwrap()).unwrap();
    out
}

#[test]
fn unsupported_configs_are_refused_by_key() {
    let gemma: &[(&str, serde_json::Value, &str)] = &[
        (
            "rope_scaling",
            serde_json::json!({"rope_type": "yarn", "factor": 8.0}),
            "rope_type `yarn`",
        ),
        ("attn_logit_softcapping", serde_json::json!(50.0), "attn_logit_softcapping"),
        ("hidden_activation", serde_json::json!("silu"), "hidden_activation"),
        ("use_bidirectional_attention", serde_json::json!(true), "use_bidirectional_attention"),
        ("layer_types", serde_json::json!(["chunked_attention"]), "layer_types"),
    ];
    for (key, value, expected) in gemma {
        let d = edited("text_encoder", "config.json", |c| c["text_config"][*key] = value.clone());
        let err = Gemma3TextConfig::load(&d.join("config.json")).expect_err(key).to_string();
        assert!(err.contains(expected) && err.contains("text_config."), "{key}: {err}");
    }
    let connectors: &[(&str, serde_json::Value, &str)] = &[
        ("rope_type", serde_json::json!("mrope"), "rope_type"),
        ("some_new_flag", serde_json::json!(true), "some_new_flag"),
        ("video_connector_num_attention_heads", serde_json::json!(3), "caption_channels"),
        (
            "audio_connector_num_learnable_registers",
            serde_json::json!(0),
            "audio_connector_num_learnable_registers",
        ),
    ];
    for (key, value, expected) in connectors {
        let d = edited("connectors_ltx20", "config.json", |c| c[*key] = value.clone());
        let err = Ltx2ConnectorsConfig::load(&d.join("config.json")).expect_err(key).to_string();
        assert!(err.contains(expected), "{key}: {err}");
    }
}

#[test]
fn missing_tensors_are_named() {
    let out = scratch("ltx2-text-missing");
    let source = tiny_dir().join("text_encoder");
    std::fs::copy(source.join("config.json"), out.join("config.json")).unwrap();
    let kept: Vec<(String, Tensor)> = Tensor::read_safetensors(source.join("model.safetensors"))
        .unwrap()
        .into_iter()
        .filter(|(name, _)| {
            name != "model.language_model.layers.1.pre_feedforward_layernorm.weight"
        })
        .collect();
    Tensor::write_safetensors(&kept, out.join("model.safetensors")).unwrap();
    match Gemma3TextEncoder::load(&out, Device::Cpu, Kind::Float) {
        Err(e) => assert!(e.to_string().contains("layers.1.pre_feedforward_layernorm"), "{e}"),
        Ok(_) => panic!("a checkpoint without a layer norm loaded"),
    }
}

#[test]
fn connectors_refuse_lengths_the_registers_do_not_divide() {
    let model =
        Ltx2TextConnectors::load(&tiny_dir().join("connectors_ltx20"), Device::Cpu, Kind::Float)
            .expect("load");
    let c = &model.config;
    let embeds = Tensor::zeros(
        [1, 6, c.caption_channels * c.text_proj_in_factor],
        (Kind::Float, Device::Cpu),
    );
    let mask = Tensor::ones([1, 6], (Kind::Int64, Device::Cpu));
    let err =
        tch::no_grad(|| model.forward(&embeds, &mask, PaddingSide::Left)).err().expect("refused");
    assert!(err.to_string().contains("learnable registers"), "{err}");
}

/// The text config of Gemma-3-12B as Google ships it (LTX-2's text encoder): most fields are
/// transformers' defaults.
#[test]
fn gemma3_12b_config_resolves_as_transformers() {
    let out = scratch("ltx2-gemma3-12b");
    let config = serde_json::json!({
        "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
        "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
        "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
        "text_config": {
            "hidden_size": 3840, "intermediate_size": 15360, "model_type": "gemma3_text",
            "num_attention_heads": 16, "num_hidden_layers": 48, "num_key_value_heads": 8,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024
        },
        "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
        "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
            "model_type": "siglip_vision_model", "num_attention_heads": 16,
            "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": false}
    });
    std::fs::write(out.join("config.json"), config.to_string()).unwrap();
    let c = Gemma3TextConfig::load(&out.join("config.json")).expect("parse");
    assert_eq!(
        (c.vocab_size, c.hidden_size, c.head_dim, c.num_key_value_heads),
        (262_208, 3840, 256, 8)
    );
    assert_eq!((c.query_pre_attn_scalar, c.sliding_window), (256.0, 1024));
    assert_eq!((c.full_rope.theta, c.full_rope.factor, c.sliding_rope.theta), (1e6, 8.0, 1e4));
    let global: Vec<usize> = c
        .layer_types
        .iter()
        .enumerate()
        .filter(|(_, k)| **k == LayerKind::Full)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(global, vec![5, 11, 17, 23, 29, 35, 41, 47]);
}

/// The whole path runs in bf16 (as the pipeline does) and stays near the f32 reference.
#[test]
fn bf16_prompt_path_runs_near_the_reference() {
    let io = tensors("ltx2_text_io.safetensors");
    let root = tiny_dir();
    let kind = Kind::BFloat16;
    let encoder = Gemma3PromptEncoder::load(
        &root.join("text_encoder"),
        &root.join("tokenizer"),
        Device::Cpu,
        kind,
    )
    .expect("load");
    let (prompts, length) = (CASES[0].1, CASES[0].2);
    let (embeds, mask) = tch::no_grad(|| encoder.encode(prompts, length)).expect("encode");
    assert_eq!(embeds.kind(), kind);
    let mut check = Checker::new("ltx2_text_io.safetensors prompts.mixed in bf16");
    check.case();
    check.close_within("embeds", &embeds, &io["prompts.mixed.embeds"], 3e-2);
    for name in CONNECTORS {
        let model = Ltx2TextConnectors::load(&root.join(name), Device::Cpu, kind).expect("load");
        let out = tch::no_grad(|| model.forward(&embeds, &mask, PaddingSide::Left)).expect("run");
        assert_eq!((out.video.kind(), out.audio.kind()), (kind, kind));
        let what = format!("prompts.mixed.{name}");
        check.close_within(
            &format!("{what}.video"),
            &out.video,
            &io[&format!("{what}.video")],
            1e-1,
        );
        check.close_within(
            &format!("{what}.audio"),
            &out.audio,
            &io[&format!("{what}.audio")],
            1e-1,
        );
        assert_eq!(out.mask, io[&format!("{what}.mask")]);
    }
    check.finish();
}

/// A checkpoint in transformers < 4.52's key layout (`language_model.model.…`, `vision_tower.…`,
/// `multi_modal_projector.…`, `language_model.lm_head.weight`) loads into the same model.
#[test]
fn older_key_layout_loads() {
    let io = tensors("ltx2_text_io.safetensors");
    let source = tiny_dir().join("text_encoder");
    let out = scratch("ltx2-gemma3-old-keys");
    std::fs::copy(source.join("config.json"), out.join("config.json")).unwrap();
    let mut renamed: Vec<(String, Tensor)> =
        Tensor::read_safetensors(source.join("model.safetensors"))
            .unwrap()
            .into_iter()
            .map(|(name, t)| {
                let name = match name.strip_prefix("model.language_model.") {
                    Some(rest) => format!("language_model.model.{rest}"),
                    None => name.strip_prefix("model.").expect("model. prefix").to_string(),
                };
                (name, t)
            })
            .collect();
    let embed = renamed.iter().find(|(n, _)| n.ends_with("embed_tokens.weight")).unwrap();
    renamed.push(("language_model.lm_head.weight".into(), embed.1.copy()));
    Tensor::write_safetensors(&renamed, out.join("model.safetensors")).unwrap();
    let model = Gemma3TextEncoder::load(&out, Device::Cpu, Kind::Float).expect("load");
    let states =
        tch::no_grad(|| model.hidden_states(&io["gemma3.input_ids"], &io["gemma3.attention_mask"]))
            .expect("forward");
    let mut check = Checker::new("ltx2_text_io.safetensors gemma3.hidden_states.* (old keys)");
    check.case();
    for (k, state) in states.iter().enumerate() {
        let reference = &io[&format!("gemma3.hidden_states.{k}")];
        check.close_within(&format!("hidden_states[{k}]"), state, reference, RTOL);
    }
    check.finish();
}
