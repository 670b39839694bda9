//! `shapes_geneval` through the `Reward` trait and the registry, on rendered shapes scenes.

use flowtune_rewards::{
    build, score_batch, OnError, Reward, RewardConfig, RewardFunction, RgbImage, Sample,
    ShapesGeneval,
};
use flowtune_shapes::{render, Task};
use serde_json::{json, Value};

const LEFT: &str = "a photo of a circle left of a square";
const RIGHT: &str = "a photo of a circle right of a square";

fn scene(prompt: &str) -> RgbImage {
    render(&Task::parse(prompt).unwrap(), 3, 32)
}

fn sample<'a>(image: &'a RgbImage, prompt: &'a str, extra_info: &'a Value) -> Sample<'a> {
    Sample {
        image,
        frames: 1,
        audio: None,
        prompt,
        ground_truth: None,
        data_source: "shapes",
        extra_info,
    }
}

fn config(function: Value) -> RewardConfig {
    RewardConfig {
        functions: vec![serde_json::from_value::<RewardFunction>(function).unwrap()],
        ..Default::default()
    }
}

#[test]
fn right_scenes_score_one_and_wrong_ones_zero_with_per_category_accuracy() {
    let (left, right, three) = (scene(LEFT), scene(RIGHT), scene("a photo of three triangles"));
    let none = Value::Null;
    let samples = [
        sample(&left, LEFT, &none),
        sample(&right, LEFT, &none),
        sample(&three, "a photo of three triangles", &none),
    ];
    let scores = ShapesGeneval { partial: false }.score(&samples).unwrap();
    let values: Vec<f64> = scores.iter().map(|s| s.value).collect();
    assert_eq!(values, [1.0, 0.0, 1.0]);
    let extras = |pairs: [(&str, f64); 2]| pairs.map(|(k, v)| (k.to_string(), v)).into();
    let accuracy = |i: usize| -> std::collections::BTreeMap<String, f64> {
        let e = &scores[i].extras;
        e.iter()
            .filter(|(k, _)| !k.starts_with("free_color/"))
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    };
    assert_eq!(accuracy(1), extras([("acc", 0.0), ("position/acc", 0.0)]));
    assert_eq!(accuracy(2), extras([("acc", 1.0), ("counting/acc", 1.0)]));
    // Prompts without colours also carry the shares of the colours drawn: five, summing to 1.
    let free: Vec<f64> = (scores[2].extras.iter())
        .filter(|(k, _)| k.starts_with("free_color/"))
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(free.len(), 5);
    assert!((free.iter().sum::<f64>() - 1.0).abs() < 1e-12, "{free:?}");
    let red = scene("a photo of a red circle");
    let named = ShapesGeneval { partial: false };
    let named = named.score(&[sample(&red, "a photo of a red circle", &none)]).unwrap();
    assert_eq!(named[0].extras, extras([("acc", 1.0), ("colors/acc", 1.0)]));

    let scorers = build(&config(json!({"name": "shapes_geneval", "weight": 2.0}))).unwrap();
    let batch = score_batch(&scorers, &samples, OnError::Fail).unwrap();
    assert_eq!(batch.totals, [Some(2.0), Some(0.0), Some(2.0)]);
    assert_eq!(batch.metrics()["critic/position/acc/mean"], 0.5);
    assert_eq!(batch.metrics()["critic/counting/acc/mean"], 1.0);
}

#[test]
fn partial_mode_scores_the_fraction_of_checks() {
    let scorers = build(&config(json!({"name": "shapes_geneval", "partial": true}))).unwrap();
    let (right, blank) = (scene(RIGHT), RgbImage::from_pixel(32, 32, flowtune_shapes::BACKGROUND));
    let none = Value::Null;
    let scores = scorers[0].0.score(&[sample(&right, LEFT, &none), sample(&blank, LEFT, &none)]);
    let scores = scores.unwrap();
    assert!((scores[0].value - 2.0 / 3.0).abs() < 1e-12, "both shapes, wrong side: {scores:?}");
    assert_eq!(scores[0].extras["position/acc"], 0.0, "accuracy stays 1 / 0");
    assert_eq!(scores[1].value, 0.0);
}

#[test]
fn the_task_comes_from_extra_info_before_the_prompt() {
    let left = scene(LEFT);
    let task = serde_json::to_value(Task::parse(LEFT).unwrap()).unwrap();
    let as_string = Value::String(task.to_string());
    let reward = ShapesGeneval { partial: false };
    for extra_info in [json!({"task": task}), json!({"task": as_string})] {
        let scores = reward.score(&[sample(&left, "a circle, then a square", &extra_info)]);
        assert_eq!(scores.unwrap()[0].value, 1.0, "{extra_info}");
    }
    let wrong = json!({"task": serde_json::to_value(Task::parse(RIGHT).unwrap()).unwrap()});
    assert_eq!(reward.score(&[sample(&left, LEFT, &wrong)]).unwrap()[0].value, 0.0);
}

#[test]
fn prompts_without_a_task_fail_with_the_prompt_named() {
    let image = scene(LEFT);
    let reward = ShapesGeneval { partial: false };
    let none = Value::Null;
    let err = reward.score(&[sample(&image, "a cat on a mat", &none)]).unwrap_err().to_string();
    assert!(
        err.starts_with("reward `shapes_geneval`: not a shapes prompt: \"a cat on a mat\"")
            && err.contains("no extra_info.task"),
        "{err}"
    );
    let broken = json!({"task": {"category": "counting"}});
    let err = reward.score(&[sample(&image, LEFT, &broken)]).unwrap_err().to_string();
    assert!(err.contains("extra_info.task of prompt") && err.contains("missing field"), "{err}");
}

#[test]
fn partial_is_a_checked_option_of_shapes_geneval_only() {
    let typo =
        serde_json::from_value::<RewardFunction>(json!({"name": "shapes_geneval", "partal": true}));
    assert!(typo.unwrap_err().to_string().contains("unknown field `partal`"));
    let err = build(&config(json!({"name": "jpeg_compressibility", "partial": true}))).err();
    assert!(
        err.unwrap().to_string().contains("`partial` applies only to shapes_geneval"),
        "partial elsewhere is a mistake, not ignored"
    );
    let written = serde_json::to_value(RewardConfig::default()).unwrap();
    assert!(written["functions"][0].get("partial").is_none(), "the default is not written");
}
