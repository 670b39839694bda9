//! The `hpsv3` reward on the tiny Qwen2-VL preference model of
//! `scripts/reference_preference_model.py`: its score is the head's first output and
//! `hpsv3/log_sigma` its second, as the reference computes them for the same pictures and prompts
//! (batches of 3 and 1); a prompt without the reward token is refused before loading.

use flowtune_fixtures::{dir, json, tensors};
use flowtune_rewards::{build, RewardConfig, RgbImage, Sample};
use serde_json::json;
use tch::Tensor;

fn picture(t: &Tensor) -> RgbImage {
    let (h, w) = (t.size()[0] as u32, t.size()[1] as u32);
    RgbImage::from_raw(w, h, Vec::<u8>::try_from(t.reshape([-1])).expect("u8")).expect("RGB")
}

fn config(hpsv3: serde_json::Value) -> RewardConfig {
    serde_json::from_value(json!({"functions": [{"name": "hpsv3", "hpsv3": hpsv3}]})).unwrap()
}

#[test]
fn hpsv3_scores_as_its_reference() {
    let spec = json("preference.json");
    let io = tensors("preference_io.safetensors");
    let judge_io = tensors("vlm_judge_io.safetensors");
    let pictures: Vec<RgbImage> =
        (0..4).map(|i| picture(&judge_io[&format!("picture{i}")])).collect();
    let prompts: Vec<&str> =
        spec["prompts"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    let model = dir().join(spec["model"].as_str().unwrap());
    let scorers = build(&config(json!({
        "model": model.display().to_string(),
        "user_prompt": "Rate the picture for: {prompt}\nPlease provide the overall ratings of this image: <|Reward|>\n\nEND\n",
        "pixels": 28 * 28 * 9,
        "device": "cpu",
        "batch_size": 3,
    })))
    .unwrap();
    let null = serde_json::Value::Null;
    let samples: Vec<Sample<'_>> = (0..4)
        .map(|i| Sample {
            image: &pictures[i],
            frames: 1,
            audio: None,
            prompt: prompts[i],
            ground_truth: None,
            data_source: "test",
            extra_info: &null,
        })
        .collect();
    let scores = scorers[0].0.score(&samples).unwrap();
    let want = Vec::<f32>::try_from(io["scores"].reshape([-1])).unwrap();
    for (k, (score, pair)) in scores.iter().zip(want.chunks(2)).enumerate() {
        let (mu, log_sigma) = (f64::from(pair[0]), f64::from(pair[1]));
        assert!(
            (score.value - mu).abs() <= 1e-4 * mu.abs().max(1.0),
            "row {k}: {} vs {mu}",
            score.value
        );
        let got = score.extras["hpsv3/log_sigma"];
        assert!(
            (got - log_sigma).abs() <= 1e-4 * log_sigma.abs().max(1.0),
            "row {k}: {got} vs {log_sigma}"
        );
    }
    let err =
        build(&config(json!({"model": model.display().to_string(), "user_prompt": "{prompt}"})))
            .err()
            .unwrap()
            .to_string();
    assert!(err.contains("hpsv3.user_prompt must hold <|Reward|> once"), "{err}");
}
