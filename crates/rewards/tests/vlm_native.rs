//! `vlm_judge` with `backend: native` (the judge in this process) on the tiny random judges of
//! `scripts/reference_vlm_judge.py`:
//! - the same pictures scored by the native judge and by the OpenAI-API judge pointed at a
//!   loopback server that answers from the same folder through transformers
//!   (`scripts/serve_vlm_judge.py`) give the same scores (greedy answers, `ocr` mode);
//! - `expectation` scores are transformers' score-token probabilities weighed by their values;
//! - settings the native judge cannot honour are refused by name before anything loads.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use flowtune_fixtures::{dir, json, tensors};
use flowtune_rewards::{
    ocr_score, HttpSettings, JudgeBackend, JudgeMode, NativeJudge, Reward, RewardError, RgbImage,
    Sample, VlmJudge, VlmSettings,
};
use tch::{Device, Tensor};

fn picture(t: &Tensor) -> RgbImage {
    let (h, w) = (t.size()[0] as u32, t.size()[1] as u32);
    RgbImage::from_raw(w, h, Vec::<u8>::try_from(t.reshape([-1])).expect("u8")).expect("RGB")
}

fn pictures() -> Vec<RgbImage> {
    let io = tensors("vlm_judge_io.safetensors");
    (0..4).map(|i| picture(&io[&format!("picture{i}")])).collect()
}

fn native(folder: &str) -> VlmSettings {
    VlmSettings {
        backend: JudgeBackend::Native,
        model: dir().join(folder).display().to_string(),
        temperature: 0.0,
        max_tokens: 24,
        device: Some("cpu".into()),
        batch_size: 3,
        ..Default::default()
    }
}

/// The project venv's Python with transformers (`make setup` installs it for the GPU suite's
/// anchors).
fn python() -> (PathBuf, PathBuf) {
    let home = PathBuf::from(std::env::var("HOME").unwrap_or_default());
    let var = |k: &str| std::env::var_os(k).map(PathBuf::from);
    let cache = var("FLOWTUNE_CACHE").unwrap_or_else(|| home.join(".cache/flowtune"));
    let python = var("FLOWTUNE_VENV").unwrap_or_else(|| cache.join("venv")).join("bin/python");
    (python, cache.join("anchors"))
}

/// The loopback server on `folder`, and its chat-completions URL. It exits when its stdin closes.
fn serve(folder: &str) -> (Child, String) {
    let (python, site) = python();
    let script = dir().join("../scripts/serve_vlm_judge.py");
    let mut child = Command::new(&python)
        .arg(&script)
        .arg(dir().join(folder))
        .args(["--port", "0"])
        .env("PYTHONPATH", &site)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{python:?} {script:?} (run `make setup`): {e}"));
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line.trim().strip_prefix("listening on ").unwrap_or_else(|| {
        panic!("the server said {line:?}; transformers in {site:?}? (make setup)")
    });
    (child, url.to_string())
}

/// The fixture's conversations (rows with the system prompt "You judge pictures.") scored in
/// `ocr` mode against ground truths that are transformers' answers with their last three
/// characters changed: any token of an answer that differs moves its score.
#[test]
fn native_and_served_judges_give_the_same_scores() {
    let pictures = pictures();
    let prefix = "Rate the picture from 1 to 5 for: ";
    let null = serde_json::Value::Null;
    for (m, folder) in [("qwen25", "vlm_qwen25_tiny"), ("qwen3", "vlm_qwen3_tiny")] {
        let spec = &json("vlm_judge.json")[m];
        let rows: Vec<usize> = (0..4).filter(|&k| spec["system"][k].as_str().is_some()).collect();
        let prompts: Vec<&str> = rows
            .iter()
            .map(|&k| spec["user"][k].as_str().unwrap().strip_prefix(prefix).expect(prefix))
            .collect();
        let answers: Vec<&str> =
            rows.iter().map(|&k| spec["answers"][k].as_str().unwrap()).collect();
        let truths: Vec<String> = answers
            .iter()
            .map(|a| {
                let chars: Vec<char> = a.chars().collect();
                chars[..chars.len() - 3].iter().collect::<String>() + "#@%"
            })
            .collect();
        let samples: Vec<Sample<'_>> = rows
            .iter()
            .enumerate()
            .map(|(i, &k)| Sample {
                image: &pictures[k],
                frames: 1,
                audio: None,
                prompt: prompts[i],
                ground_truth: Some(&truths[i]),
                data_source: "test",
                extra_info: &null,
            })
            .collect();
        let settings = VlmSettings {
            system_prompt: spec["system"][rows[0]].as_str().unwrap().into(),
            user_prompt: format!("{prefix}{{prompt}}"),
            max_tokens: 40,
            ..native(folder)
        };
        let want: Vec<f64> =
            answers.iter().zip(&truths).map(|(a, t)| ocr_score(a, t).unwrap()).collect();
        assert!(want.iter().all(|&w| w > 0.5 && w < 1.0), "{m}: {want:?}");
        let judge = NativeJudge::new(settings.clone(), Device::Cpu).expect("native judge");
        let scores = judge.score(&samples).expect("native scores");
        let (mut server, url) = serve(folder);
        let served = VlmSettings {
            backend: JudgeBackend::Openai,
            model: "tiny".into(),
            device: None,
            ..settings
        };
        let http = HttpSettings { max_concurrency: 1, ..Default::default() };
        let remote = VlmJudge::new(url, served, http).expect("served judge");
        let expected = remote.score(&samples);
        drop(server.stdin.take());
        server.wait().unwrap();
        let expected = expected.expect("served scores");
        let values: Vec<f64> = scores.iter().map(|s| s.value).collect();
        let served: Vec<f64> = expected.iter().map(|s| s.value).collect();
        assert_eq!(values, want, "{m}: native vs transformers' answers");
        assert_eq!(served, want, "{m}: the served judge vs transformers' answers");
        for (s, &k) in scores.iter().zip(&rows) {
            let tokens = s.extras["vlm_judge/answer_tokens"];
            let want = Vec::<i64>::try_from(
                tensors("vlm_judge_io.safetensors")[&format!("{m}.generated")].get(k as i64),
            )
            .unwrap()
            .iter()
            .take_while(|&&t| t != 452)
            .count();
            assert_eq!(tokens, want as f64, "{m} row {k}: answer tokens");
        }
    }
}

#[test]
fn expectation_weighs_the_score_tokens_as_transformers_gives_them() {
    let io = tensors("vlm_judge_io.safetensors");
    let spec = &json("vlm_judge.json")["qwen3"];
    let pictures = pictures();
    let prefix = "Rate the picture from 1 to 5 for: ";
    let users: Vec<&str> =
        spec["user"].as_array().unwrap().iter().map(|u| u.as_str().unwrap()).collect();
    let prompts: Vec<&str> = users.iter().map(|u| u.strip_prefix(prefix).expect(prefix)).collect();
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
    let settings = VlmSettings {
        mode: JudgeMode::Expectation,
        system_prompt: spec["system"][0].as_str().unwrap().into(),
        user_prompt: format!("{prefix}{{prompt}}"),
        score_tokens: (1..=5).map(|v| (v.to_string(), f64::from(v))).collect(),
        ..native("vlm_qwen3_tiny")
    };
    let scores = NativeJudge::new(settings, Device::Cpu).unwrap().score(&samples).unwrap();
    let probs = Vec::<f32>::try_from(io["qwen3.score_probs"].reshape([-1])).unwrap();
    for (k, (score, p)) in scores.iter().zip(probs.chunks(5)).enumerate() {
        let mass: f64 = p.iter().map(|&x| f64::from(x)).sum();
        let mean: f64 =
            p.iter().zip(1..).map(|(&x, v)| f64::from(x) * f64::from(v)).sum::<f64>() / mass;
        let want = (mean - 1.0) / 4.0;
        assert!((score.value - want).abs() <= 1e-5, "row {k}: {} vs {want}", score.value);
        assert!((score.extras["vlm_judge/score_token_mass"] - mass).abs() <= 1e-5);
    }
}

#[test]
fn settings_the_native_judge_cannot_honour_are_refused_by_name() {
    let refused = |settings: VlmSettings, says: &str| {
        let err = match NativeJudge::new(settings, Device::Cpu) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted; expected {says}"),
        };
        assert!(err.contains(says), "{err}");
    };
    let sampled = VlmSettings { temperature: 0.7, ..native("vlm_qwen25_tiny") };
    refused(sampled, "set vlm.temperature: 0");
    let words = VlmSettings {
        mode: JudgeMode::Expectation,
        score_tokens: [("excellent picture".to_string(), 1.0)].into(),
        ..native("vlm_qwen25_tiny")
    };
    refused(words, "\"excellent picture\" is");
    let untokened = VlmSettings { mode: JudgeMode::Expectation, ..native("vlm_qwen25_tiny") };
    refused(untokened, "needs vlm.score_tokens");
    let missing = VlmSettings { model: "/nonexistent/judge".into(), ..native("vlm_qwen25_tiny") };
    refused(missing, "/nonexistent/judge");
    let served = VlmSettings { backend: JudgeBackend::Openai, ..native("vlm_qwen25_tiny") };
    let err =
        VlmJudge::new("http://127.0.0.1:9/v1/chat/completions".into(), served, Default::default());
    assert!(
        matches!(err, Err(RewardError::Config(m)) if m.contains("vlm.device applies only to backend: native"))
    );
}
