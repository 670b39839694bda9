//! The CLIP-L tokenizer of FLUX.1 and SD3 pipelines on the real vocabulary: ids (padded to 77,
//! truncated) equal transformers' `CLIPTokenizer` on 235 prompts
//! (`scripts/reference_clip_tokenizer.py`).

use std::io::Read;

use flowtune_fixtures::{dir, json};
use flowtune_models::tokenizer::TextTokenizer;

#[test]
fn clip_ids_match_transformers_on_the_real_vocabulary() {
    let fixture = dir().join("clip_l_tokenizer");
    let mut text = String::new();
    let gz =
        std::fs::File::open(fixture.join("tokenizer.json.gz")).expect("open tokenizer.json.gz");
    flate2::read::GzDecoder::new(gz).read_to_string(&mut text).expect("gunzip");
    let tokenizer_dir = flowtune_fixtures::scratch("clip-tokenizer");
    std::fs::write(tokenizer_dir.join("tokenizer.json"), text).expect("write");
    std::fs::copy(
        fixture.join("tokenizer_config.json"),
        tokenizer_dir.join("tokenizer_config.json"),
    )
    .expect("copy config");
    let tokenizer = TextTokenizer::load(&tokenizer_dir).expect("load tokenizer");
    assert_eq!(tokenizer.model_max_length, Some(77));

    let cases = json("clip_l_tokenizer_ids.json");
    let cases = cases.as_array().expect("list");
    assert!(cases.len() >= 200, "{} prompts", cases.len());
    let mut failures = vec![];
    for case in cases {
        let prompt = case["prompt"].as_str().expect("prompt");
        let expected: Vec<i64> = serde_json::from_value(case["ids"].clone()).expect("ids");
        let ids = Vec::<i64>::try_from(tokenizer.encode(&[prompt], 77).expect("encode").view([-1]))
            .expect("ids");
        if ids != expected {
            failures.push(format!("{prompt:?}: {ids:?} != {expected:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
