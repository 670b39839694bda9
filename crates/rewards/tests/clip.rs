//! CLIP-family rewards against transformers (`scripts/reference_clip.py`): tiny random
//! `CLIPModel`s (quick-GELU ViT-B style and GELU CLIP-H style) give the same embeddings and
//! scores, the image processor the same pixels, and the CLIP tokenizer built from OpenAI's merges
//! the same ids as transformers' `CLIPTokenizer` on 248 prompts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use flowtune_models::clip::{self, AestheticHead, ClipImageProcessor, ClipModel};
use flowtune_rewards::{
    build, clip_score, pickscore, ClipSettings, RewardConfig, RewardFunction, Sample,
    PICKSCORE_DIVISOR,
};
use tch::{Device, Kind, Tensor};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/clip")
}

fn io(model: &str) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(fixtures().join(format!("{model}_io.safetensors")))
        .unwrap()
        .into_iter()
        .collect()
}

/// ‖a − b‖ / ‖b‖.
fn relative(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_kind(Kind::Double).reshape([-1]), b.to_kind(Kind::Double).reshape([-1]));
    (&a - &b).norm().double_value(&[]) / b.norm().double_value(&[])
}

fn images() -> Vec<image::RgbImage> {
    (0..4)
        .map(|i| image::open(fixtures().join(format!("image_{i}.png"))).unwrap().to_rgb8())
        .collect()
}

#[test]
fn tiny_clip_models_match_transformers() {
    for name in ["clip_tiny", "clip_h_tiny"] {
        let model = ClipModel::load(&fixtures().join(name), Device::Cpu, Kind::Float).unwrap();
        let io = io(name);
        let _guard = tch::no_grad_guard();
        let vision = model.vision(&io["pixel_values"]).unwrap();
        let image = model.image_embeds(&io["pixel_values"]).unwrap();
        let text = model.text_embeds(&io["input_ids"]).unwrap();
        let errors = [
            (
                "vision_last_hidden_state",
                relative(&vision.last_hidden_state, &io["vision_last_hidden_state"]),
            ),
            ("vision_pooled", relative(&vision.pooled, &io["vision_pooled"])),
            ("image_embeds", relative(&image, &io["image_embeds"])),
            ("text_embeds", relative(&text, &io["text_embeds"])),
        ];
        println!("{name}: {errors:?}");
        for (what, err) in errors {
            assert!(err <= 1e-4, "{name} {what}: relative error {err:.2e}");
        }
        let scale = io["logit_scale"].exp().double_value(&[]);
        assert!((model.logit_scale() - scale).abs() <= 1e-9 * scale);
        let close = |ours: Vec<f64>, theirs: &Tensor, what: &str| {
            let theirs = Vec::<f64>::try_from(theirs.to_kind(Kind::Double)).unwrap();
            for (a, b) in ours.iter().zip(&theirs) {
                assert!(
                    (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                    "{name} {what}: {ours:?} vs {theirs:?}"
                );
            }
        };
        close(clip_score(&image, &text), &io["clip_score"], "clip_score");
        close(pickscore(&image, &text, model.logit_scale()), &io["pickscore"], "pickscore");
        if name == "clip_tiny" {
            let head =
                AestheticHead::load(&fixtures().join("aesthetic_head.safetensors"), Device::Cpu)
                    .unwrap();
            close(
                Vec::<f64>::try_from(head.forward(&image).to_kind(Kind::Double)).unwrap(),
                &io["aesthetic"],
                "aesthetic",
            );
        }
    }
}

#[test]
fn the_image_processor_matches_transformers_within_one_level() {
    let processor = ClipImageProcessor::load(&fixtures().join("clip_tiny")).unwrap();
    let images = images();
    let raw: Vec<(usize, usize, &[u8])> = images
        .iter()
        .map(|i| (i.height() as usize, i.width() as usize, i.as_raw().as_slice()))
        .collect();
    let ours = processor.pixel_values(&raw, Device::Cpu).unwrap();
    let theirs = &io("clip_tiny")["pixel_values"];
    assert_eq!(ours.size(), theirs.size());
    // PIL's bicubic and libtorch's antialiased bicubic round to 8 bits each; one level is
    // 1/255/std ≈ 0.0146 after normalisation.
    let diff = (&ours - theirs).abs();
    let (max, mean) = (diff.max().double_value(&[]), diff.mean(Kind::Double).double_value(&[]));
    println!("pixel_values: max |Δ| {max:.4}, mean |Δ| {mean:.5}");
    assert!(max <= 0.03 && mean <= 0.003, "max {max}, mean {mean}");
}

#[test]
fn the_clip_tokenizer_matches_transformers_on_248_prompts() {
    let cache = std::env::var_os("FLOWTUNE_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/flowtune")
    });
    let merges = cache.join("clip/bpe_simple_vocab_16e6.txt.gz");
    let tokenizer = clip::tokenizer::from_merges_file(&merges)
        .unwrap_or_else(|e| panic!("{e} (run scripts/setup-rewards.sh)"));
    let cases: Vec<serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("tokenizer_ids.json")).unwrap(),
    )
    .unwrap();
    assert!(cases.len() >= 200);
    let prompts: Vec<&str> = cases.iter().map(|c| c["prompt"].as_str().unwrap()).collect();
    let ids = tokenizer.encode(&prompts, 77).unwrap();
    let mut wrong = vec![];
    for (i, case) in cases.iter().enumerate() {
        let want: Vec<i64> =
            case["ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
        let got = Vec::<i64>::try_from(ids.get(i as i64)).unwrap();
        if got != want {
            wrong.push(format!("{:?}: {got:?} vs {want:?}", prompts[i]));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} prompts differ:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}

#[test]
fn the_rewards_score_pictures_and_prompts_end_to_end() {
    // The tiny models' vocabulary is 1000 wide, so prompts go through a word-level tokenizer
    // written for the test (ids < 1000); this checks the wiring, the parity test the numbers.
    let tok_dir = flowtune_fixtures::scratch("clip-tok");
    let words: Vec<String> =
        "a red cat on blue sky photo of dog".split(' ').map(String::from).collect();
    let (tokenizer, size) = flowtune_models::tokenizer::tiny::clip_words(&words).unwrap();
    assert!(size < 1000);
    flowtune_models::tokenizer::tiny::write(
        &tok_dir,
        &tokenizer,
        serde_json::json!({"pad_token": "<|endoftext|>", "model_max_length": 77}),
    )
    .unwrap();
    let settings = |head: Option<PathBuf>| ClipSettings {
        model: fixtures().join("clip_tiny"),
        head,
        tokenizer: Some(tok_dir.to_path_buf()),
        device: Some("cpu".into()),
        batch_size: 3,
    };
    let mut functions = vec![];
    for (name, head) in [
        ("clip_score", None),
        ("pickscore", None),
        ("aesthetic", Some(fixtures().join("aesthetic_head.safetensors"))),
    ] {
        let mut f = RewardFunction::named(name);
        f.clip = Some(settings(head));
        functions.push(f);
    }
    let scorers = build(&RewardConfig { functions, ..Default::default() }).unwrap();
    let images = images();
    let extra = serde_json::Value::Null;
    let prompts = ["a red cat", "photo of a dog", "blue sky", "a cat on a dog"];
    let samples: Vec<Sample<'_>> = images
        .iter()
        .zip(prompts)
        .map(|(image, prompt)| Sample {
            image,
            frames: 1,
            audio: None,
            prompt,
            ground_truth: None,
            data_source: "t",
            extra_info: &extra,
        })
        .collect();
    let scores: Vec<Vec<f64>> = scorers
        .iter()
        .map(|(s, _)| s.score(&samples).unwrap().iter().map(|s| s.value).collect())
        .collect();
    // The same numbers by hand from the model's parts (batches of 3 and 1 give the 4 rows).
    let model = ClipModel::load(&fixtures().join("clip_tiny"), Device::Cpu, Kind::Float).unwrap();
    let processor = ClipImageProcessor::load(&fixtures().join("clip_tiny")).unwrap();
    let raw: Vec<(usize, usize, &[u8])> = images
        .iter()
        .map(|i| (i.height() as usize, i.width() as usize, i.as_raw().as_slice()))
        .collect();
    let _guard = tch::no_grad_guard();
    let image = model.image_embeds(&processor.pixel_values(&raw, Device::Cpu).unwrap()).unwrap();
    let tok = clip::tokenizer::load(&tok_dir).unwrap();
    let text = model.text_embeds(&tok.encode(&prompts, 77).unwrap()).unwrap();
    let head =
        AestheticHead::load(&fixtures().join("aesthetic_head.safetensors"), Device::Cpu).unwrap();
    let expected = [
        clip_score(&image, &text),
        pickscore(&image, &text, model.logit_scale())
            .iter()
            .map(|v| v / PICKSCORE_DIVISOR)
            .collect(),
        Vec::<f64>::try_from(head.forward(&image).to_kind(Kind::Double)).unwrap(),
    ];
    for ((got, want), name) in
        scores.iter().zip(&expected).zip(["clip_score", "pickscore", "aesthetic"])
    {
        for (a, b) in got.iter().zip(want) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{name}: {got:?} vs {want:?}");
        }
    }
    assert!(scores[0].iter().all(|&v| (0.0..=100.0).contains(&v)));
}

#[test]
fn a_head_of_the_wrong_width_is_named() {
    let mut f = RewardFunction::named("aesthetic");
    f.clip = Some(ClipSettings {
        model: fixtures().join("clip_h_tiny"),
        head: Some(fixtures().join("aesthetic_head.safetensors")),
        tokenizer: None,
        device: Some("cpu".into()),
        batch_size: 4,
    });
    let err = build(&RewardConfig { functions: vec![f], ..Default::default() })
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("takes 16-wide embeddings") && err.contains("projects to 24"), "{err}");
}
