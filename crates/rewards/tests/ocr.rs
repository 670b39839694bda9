//! The in-process OCR reader against the reference `rapidocr` package: the committed pictures
//! (DejaVu text at several sizes, angles, colours and backgrounds, and noise) read line for line
//! as `scripts/reference_ocr.py` recorded. Needs `scripts/setup-rewards.sh` (run by `make test`).

use std::path::Path;

use flowtune_rewards::{build, OcrSettings, Reader, RewardConfig, RewardFunction, Sample};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ocr");

fn picture(name: &str) -> image::RgbImage {
    image::open(Path::new(FIXTURES).join(name)).unwrap().to_rgb8()
}

#[test]
fn reads_the_fixtures_as_rapidocr_does() {
    let reader = Reader::new(&OcrSettings::default())
        .unwrap_or_else(|e| panic!("{e} (run scripts/setup-rewards.sh)"));
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(FIXTURES).join("expected.json")).unwrap(),
    )
    .unwrap();
    let mut mismatches = vec![];
    for (name, lines) in expected.as_object().unwrap() {
        let want: Vec<(String, f64)> = lines
            .as_array()
            .unwrap()
            .iter()
            .map(|l| (l[0].as_str().unwrap().to_string(), l[1].as_f64().unwrap()))
            .collect();
        let got = reader.read(&picture(name)).unwrap();
        let texts: Vec<&str> = got.iter().map(|l| l.text.as_str()).collect();
        println!("{name}: {texts:?}");
        if texts != want.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>() {
            mismatches.push(format!("{name}: read {texts:?}, rapidocr read {want:?}"));
            continue;
        }
        for (line, (_, confidence)) in got.iter().zip(&want) {
            assert!(
                (line.confidence - confidence).abs() < 0.02,
                "{name}: {line:?} vs rapidocr {confidence}"
            );
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn the_ocr_reward_scores_text_against_the_ground_truth() {
    let mut function = RewardFunction::named("ocr");
    function.ocr = Some(OcrSettings { threads: 1, ..Default::default() });
    let scorers = build(&RewardConfig { functions: vec![function], ..Default::default() }).unwrap();
    let (banner, noise) = (picture("banner_black_on_white.png"), picture("noise.png"));
    let extra = serde_json::Value::Null;
    let sample = |image, gt| Sample {
        image,
        frames: 1,
        audio: None,
        prompt: "a sign",
        ground_truth: gt,
        data_source: "ocr",
        extra_info: &extra,
    };
    let scores = scorers[0]
        .0
        .score(&[
            sample(&banner, Some("hello world")),
            sample(&banner, Some("HELLO WORD")),
            sample(&noise, Some("hello")),
        ])
        .unwrap();
    assert_eq!(scores[0].value, 1.0, "HELLOWORLD contains helloworld");
    assert_eq!(scores[1].value, 1.0 - 1.0 / 9.0, "one deletion from helloword");
    assert_eq!(scores[2].value, 0.0, "noise reads as nothing");
    assert_eq!(scores[0].extras["ocr/lines"], 2.0);
    assert_eq!((scores[0].extras["ocr/exact"], scores[1].extras["ocr/exact"]), (1.0, 0.0));
    // No ground truth is an error naming the sample, never a 0.
    let err = scorers[0].0.score(&[sample(&banner, None)]).unwrap_err().to_string();
    assert!(err.contains("sample 0") && err.contains("ground truth"), "{err}");
}

#[test]
fn a_gpu_without_the_gpu_runtime_is_named() {
    // The CPU wheel's library has no CUDA execution provider: asking for it is an error that says
    // what to install, not a silent fallback to the CPU.
    let settings = OcrSettings { device: "cuda".into(), ..Default::default() };
    let err = Reader::new(&settings).err().unwrap();
    assert!(err.contains("cannot run on cuda:0") && err.contains("onnxruntime-gpu"), "{err}");
    let settings = OcrSettings { device: "gpu".into(), ..Default::default() };
    assert!(Reader::new(&settings).err().unwrap().contains("expected cpu, cuda or cuda:N"));
}

#[test]
fn a_missing_model_folder_is_named() {
    let settings = OcrSettings { models: Some("/nonexistent/ocr".into()), ..Default::default() };
    let err = Reader::new(&settings).err().unwrap();
    assert!(err.contains("/nonexistent/ocr") && err.contains("setup-rewards.sh"), "{err}");
}
