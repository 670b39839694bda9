//! In-process vision-language judges against transformers (`scripts/reference_vlm_judge.py`):
//! tiny random `Qwen2_5_VLForConditionalGeneration` (untied head) and
//! `Qwen3VLForConditionalGeneration` (tied head) with the tiny Qwen2 tokenizer and the official
//! chat templates, four pictures of different sizes in one left-padded batch:
//! - the rendered conversations, token ids and mask, and the processor's patches;
//! - the logits of every kept position (≤ 1e-4 relative);
//! - the greedy answers of `generate(do_sample=False, max_new_tokens=40)`, token for token;
//! - the probabilities of the score tokens "1"…"5" as the first answer token (≤ 1e-5);
//! - the parameter count (a tied head once).

use flowtune_fixtures::{dir, json, tensors, Checker, MATH_RTOL};
use flowtune_models::vlm::generate::{first_token_probabilities, generate};
use flowtune_models::vlm::VisionLanguageModel;
use image::RgbImage;
use tch::{Device, Kind, Tensor};

fn picture(t: &Tensor) -> RgbImage {
    let (h, w) = (t.size()[0] as u32, t.size()[1] as u32);
    RgbImage::from_raw(w, h, Vec::<u8>::try_from(t.reshape([-1])).expect("u8")).expect("RGB")
}

/// Rows of `states` (B, L, V) where `mask` (B, L) is 1.
fn kept(states: &Tensor, mask: &Tensor) -> Tensor {
    states.masked_select(&mask.ne(0).unsqueeze(-1)).view([-1, states.size()[2]])
}

fn check(m: &str) {
    let io = tensors("vlm_judge_io.safetensors");
    let spec = &json("vlm_judge.json")[m];
    let folder = spec["model"].as_str().expect("model folder");
    let model = VisionLanguageModel::load(&dir().join(folder), Device::Cpu, Kind::Float)
        .unwrap_or_else(|e| panic!("{folder}: {e}"));
    assert_eq!(model.parameter_count(), spec["params"].as_i64().unwrap(), "{m}: parameters");
    let pictures: Vec<RgbImage> = (0..4).map(|i| picture(&io[&format!("picture{i}")])).collect();
    let systems: Vec<Option<String>> = spec["system"]
        .as_array()
        .expect("system per row")
        .iter()
        .map(|s| s.as_str().map(str::to_string))
        .collect();
    let users: Vec<&str> = spec["user"]
        .as_array()
        .expect("user per row")
        .iter()
        .map(|u| u.as_str().unwrap())
        .collect();
    // The chat template renders as transformers' apply_chat_template.
    for (k, text) in spec["texts"].as_array().expect("texts").iter().enumerate() {
        let rendered = model.template.picture_question(systems[k].as_deref(), users[k]).unwrap();
        assert_eq!(rendered, text.as_str().unwrap(), "{m} row {k}: the rendered conversation");
    }
    let rows: Vec<_> = (0..4).map(|k| (&pictures[k], systems[k].as_deref(), users[k])).collect();
    let prompts = model.prompts(&rows, "").expect("prompts");
    let mut check = Checker::new("vlm_judge_io.safetensors");
    check.case();
    assert_eq!(prompts.input_ids, io[&format!("{m}.input_ids")], "{m}: token ids");
    assert_eq!(prompts.attention_mask, io[&format!("{m}.attention_mask")], "{m}: mask");
    let grids: Vec<i64> = prompts.grids.iter().flat_map(|g| [g.0, g.1, g.2]).collect();
    let want_grids =
        Vec::<i64>::try_from(io[&format!("{m}.image_grid_thw")].reshape([-1])).unwrap();
    assert_eq!(grids, want_grids, "{m}: patch grids");
    let pixels = &io[&format!("{m}.pixel_values")];
    check.close_within(&format!("{m} pixel_values"), &prompts.pixel_values, pixels, MATH_RTOL);
    check.case();
    let (states, _, _) = model.prefill(&prompts).expect("prefill");
    let logits = model.logits(&states);
    let mask = &prompts.attention_mask;
    let want = kept(&io[&format!("{m}.logits")], mask);
    check.close_within(&format!("{m} logits"), &kept(&logits, mask), &want, MATH_RTOL);
    check.case();
    let ids: Vec<i64> = spec["score_token_ids"]
        .as_array()
        .expect("score token ids")
        .iter()
        .map(|i| i.as_i64().unwrap())
        .collect();
    let probs = first_token_probabilities(&model, &prompts, &ids).expect("probabilities");
    let want = &io[&format!("{m}.score_probs")];
    let gap = (&probs - want).abs().max().double_value(&[]);
    assert!(gap <= 1e-5, "{m}: score-token probabilities differ by {gap:e}");
    check.finish();
    // Greedy answers, token for token (transformers pads a finished row with the pad token).
    let answers = generate(&model, &prompts, 40).expect("generate");
    let generated = &io[&format!("{m}.generated")];
    let mut long = 0;
    for (k, answer) in answers.iter().enumerate() {
        let row = Vec::<i64>::try_from(generated.get(k as i64)).unwrap();
        let end = row.iter().position(|t| model.eos_token_ids.contains(t)).unwrap_or(row.len());
        assert_eq!(answer, &row[..end], "{m} row {k}: greedy answer");
        let text: Vec<u32> = answer.iter().map(|&t| t as u32).collect();
        let decoded = model.tokenizer.decode(&text, true).unwrap();
        assert_eq!(decoded, spec["answers"][k].as_str().unwrap(), "{m} row {k}: decoded");
        long += usize::from(answer.len() >= 32);
    }
    assert!(long >= 2, "{m}: at least two answers of 32 tokens or more, got {long}");
}

#[test]
fn qwen2_5_vl_judge_matches_transformers() {
    check("qwen25");
}

#[test]
fn qwen3_vl_judge_matches_transformers() {
    check("qwen3");
}
