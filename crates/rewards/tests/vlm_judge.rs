//! The `vlm_judge` reward against a mock OpenAI-compatible server on 127.0.0.1: the request it
//! sends (image as a PNG data URI, prompts, sampling fields, bearer key), both scoring modes, and
//! the failures — HTTP 500s, a slow server, malformed answers — none of which is scored 0.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use flowtune_rewards::{
    build, score_batch, HttpSettings, JudgeMode, OnError, Reward, RewardConfig, RgbImage, Sample,
    VlmJudge, VlmSettings,
};
use serde_json::{json, Value};

/// One request the mock received.
struct Seen {
    headers: String,
    body: Value,
}

/// What the mock answers to request number n (0-based): status, body, seconds to wait first.
type Reply = dyn Fn(usize, &Value) -> (u16, String, f64) + Send + Sync;

struct Mock {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
}

fn mock(reply: impl Fn(usize, &Value) -> (u16, String, f64) + Send + Sync + 'static) -> Mock {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(vec![]));
    let reply: Arc<Reply> = Arc::new(reply);
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (log, reply) = (log.clone(), reply.clone());
            std::thread::spawn(move || serve(stream, &log, reply.as_ref()));
        }
    });
    Mock { port, seen }
}

fn serve(mut stream: TcpStream, log: &Mutex<Vec<Seen>>, reply: &Reply) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut headers = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        if line == "\r\n" {
            break;
        }
        headers.push_str(&line.to_lowercase());
    }
    let length = headers
        .lines()
        .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    let body: Value = serde_json::from_slice(&body).unwrap();
    let n = {
        let mut log = log.lock().unwrap();
        log.push(Seen { headers, body: body.clone() });
        log.len() - 1
    };
    let (code, text, delay) = reply(n, &body);
    std::thread::sleep(Duration::from_secs_f64(delay));
    let _ = write!(
        stream,
        "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
}

/// A chat completion answering `content`.
fn completion(content: &str) -> String {
    json!({
        "object": "chat.completion",
        "choices": [{ "index": 0, "message": { "role": "assistant", "content": content }, "finish_reason": "stop" }],
    })
    .to_string()
}

/// The text part of a request's user message.
fn user_text(body: &Value) -> &str {
    body["messages"][1]["content"][1]["text"].as_str().unwrap()
}

fn image(seed: u8) -> RgbImage {
    RgbImage::from_fn(12, 8, |x, y| image::Rgb([seed, (x * 20) as u8, (y * 30) as u8]))
}

fn sample<'a>(image: &'a RgbImage, prompt: &'a str, gt: Option<&'a str>) -> Sample<'a> {
    static NULL: Value = Value::Null;
    Sample {
        image,
        frames: 1,
        audio: None,
        prompt,
        ground_truth: gt,
        data_source: "t",
        extra_info: &NULL,
    }
}

fn quick() -> HttpSettings {
    HttpSettings {
        timeout_s: 5.0,
        max_retries: 0,
        backoff_s: 0.05,
        batch_size: 1,
        max_concurrency: 2,
        ca_file: None,
    }
}

fn judge(port: u16, vlm: VlmSettings, http: HttpSettings) -> VlmJudge {
    VlmJudge::new(format!("http://127.0.0.1:{port}/v1/chat/completions"), vlm, http).unwrap()
}

fn settings(mode: JudgeMode) -> VlmSettings {
    VlmSettings { model: "judge-7b".into(), mode, ..Default::default() }
}

#[test]
fn the_request_carries_the_image_prompts_sampling_fields_and_key() {
    std::env::set_var("FLOWTUNE_TEST_VLM_KEY", "s3cret");
    let server = mock(|_, _| (200, completion("Hello  World"), 0.0));
    let vlm = VlmSettings {
        user_prompt: "Read the sign for: {prompt}".into(),
        temperature: 0.3,
        top_p: 0.9,
        max_tokens: 64,
        seed: Some(7),
        api_key_env: Some("FLOWTUNE_TEST_VLM_KEY".into()),
        ..settings(JudgeMode::Ocr)
    };
    let images = [image(10), image(200)];
    let prompts = ["a sign saying \"hello world\"", "a sign saying \"hellx world\""];
    let samples = [
        sample(&images[0], prompts[0], Some("hello world")),
        sample(&images[1], prompts[1], Some("hellx world")),
    ];
    let scores = judge(server.port, vlm, quick()).score(&samples).unwrap();
    // OCR rule: an exact read scores 1, one wrong character of ten 0.9.
    assert_eq!(scores.iter().map(|s| s.value).collect::<Vec<_>>(), [1.0, 0.9]);
    let seen = server.seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "one request per image");
    for (image, prompt) in images.iter().zip(prompts) {
        let r = seen.iter().find(|r| user_text(&r.body).ends_with(prompt)).expect("a request");
        let b = &r.body;
        assert_eq!(user_text(b), format!("Read the sign for: {prompt}"));
        assert_eq!(b["model"], "judge-7b");
        assert_eq!(
            b["messages"][0],
            json!({"role": "system", "content": "You are a helpful assistant."})
        );
        assert_eq!((b["temperature"].as_f64(), b["top_p"].as_f64()), (Some(0.3), Some(0.9)));
        assert_eq!((b["max_tokens"].as_u64(), b["seed"].as_u64()), (Some(64), Some(7)));
        let url = b["messages"][1]["content"][0]["image_url"]["url"].as_str().unwrap();
        let png = base64::engine::general_purpose::STANDARD
            .decode(url.strip_prefix("data:image/png;base64,").expect("a PNG data URI"))
            .unwrap();
        assert_eq!(&image::load_from_memory(&png).unwrap().to_rgb8(), image, "the scored image");
        assert!(r.headers.contains("authorization: bearer s3cret"), "{}", r.headers);
    }
}

#[test]
fn score_mode_maps_the_last_number_and_refuses_malformed_answers() {
    let server = mock(|_, body| {
        let answer = match user_text(body).rsplit(' ').next().unwrap() {
            "best" => "The image matches. Final Score: 5",
            "worst" => "Final Score: 1",
            "middle" => "Between 3 and 4, so 3.5",
            "rambling" => "I cannot tell.",
            _ => "Final Score: 9",
        };
        (200, completion(answer), 0.0)
    });
    let vlm = VlmSettings { user_prompt: "Rate {prompt}".into(), ..settings(JudgeMode::Score) };
    let judge = judge(server.port, vlm, quick());
    let img = image(1);
    let ok = ["best", "worst", "middle"].map(|p| sample(&img, p, None));
    let scores: Vec<f64> = judge.score(&ok).unwrap().iter().map(|s| s.value).collect();
    assert_eq!(scores, [1.0, 0.0, 0.625], "(x − 1) / 4 on the 1–5 scale");

    let err = judge.score(&[sample(&img, "rambling", None)]).unwrap_err().to_string();
    assert!(err.contains("sample 0: no score in the answer \"I cannot tell.\""), "{err}");
    let err = judge.score(&[sample(&img, "off-scale", None)]).unwrap_err().to_string();
    assert!(err.contains("score 9 is outside vlm.score_range [1, 5]"), "{err}");
    // Under skip_sample a malformed answer drops the batch's samples and is counted: never 0.
    let scorers: Vec<(Box<dyn Reward>, f64)> = vec![(Box::new(judge), 1.0)];
    let mixed = [sample(&img, "best", None), sample(&img, "rambling", None)];
    let out = score_batch(&scorers, &mixed, OnError::SkipSample).unwrap();
    assert_eq!(out.totals, [None, None]);
    assert_eq!(out.metrics()["critic/rewards/failed_scorers"], 1.0);
}

#[test]
fn ocr_mode_needs_a_ground_truth_and_a_chat_completion() {
    let server = mock(|_, body| match user_text(body) {
        t if t.contains("vLLM") => {
            (200, json!({"object": "error", "message": "bad"}).to_string(), 0.0)
        }
        _ => (200, completion("OPEN"), 0.0),
    });
    let vlm = VlmSettings { user_prompt: "{prompt}".into(), ..settings(JudgeMode::Ocr) };
    let judge = judge(server.port, vlm, quick());
    let img = image(3);
    let err = judge.score(&[sample(&img, "a plain sign", None)]).unwrap_err().to_string();
    assert!(err.contains("has no ground truth"), "{err}");
    let err = judge.score(&[sample(&img, "vLLM error", Some("x"))]).unwrap_err().to_string();
    assert!(err.contains("expected a chat completion with choices[0].message.content"), "{err}");
}

#[test]
fn http_errors_and_slow_answers_are_retried_then_reported() {
    // The first request fails with HTTP 500, the next ones answer.
    let flaky = || {
        mock(|n, _| {
            if n == 0 {
                (500, r#"{"error": {"message": "overloaded"}}"#.into(), 0.0)
            } else {
                (200, completion("OPEN"), 0.0)
            }
        })
    };
    let img = image(5);
    let one = [sample(&img, "p", Some("open"))];
    let retrying = HttpSettings { max_retries: 1, ..quick() };
    let server = flaky();
    assert_eq!(
        judge(server.port, settings(JudgeMode::Ocr), retrying.clone()).score(&one).unwrap()[0]
            .value,
        1.0
    );
    let server = flaky();
    let err =
        judge(server.port, settings(JudgeMode::Ocr), quick()).score(&one).unwrap_err().to_string();
    assert!(
        err.contains("HTTP 500") && err.contains("overloaded") && err.contains("after 1 attempts"),
        "{err}"
    );

    // The first answer comes after the timeout: the retry succeeds; without retries it fails.
    let slow_first = || mock(|n, _| (200, completion("OPEN"), if n == 0 { 1.5 } else { 0.0 }));
    let short = HttpSettings { timeout_s: 0.3, ..quick() };
    let server = slow_first();
    let retried = HttpSettings { max_retries: 1, ..short.clone() };
    assert_eq!(
        judge(server.port, settings(JudgeMode::Ocr), retried).score(&one).unwrap()[0].value,
        1.0
    );
    let server = slow_first();
    let err =
        judge(server.port, settings(JudgeMode::Ocr), short).score(&one).unwrap_err().to_string();
    assert!(err.to_lowercase().contains("timed out"), "{err}");
}

#[test]
fn recipe_settings_are_checked_when_the_reward_is_built() {
    let config = |function: Value| -> RewardConfig {
        serde_json::from_value(json!({ "functions": [function] })).unwrap()
    };
    let err = |function: Value| build(&config(function)).err().expect("an error").to_string();
    let url = "http://127.0.0.1:9/v1/chat/completions";
    assert!(err(json!({"name": "vlm_judge", "url": url})).contains("needs `url:"));
    assert!(err(json!({"name": "vlm_judge", "url": url, "vlm": {}})).contains("vlm.model is empty"));
    let missing = json!({"name": "vlm_judge", "url": url,
        "vlm": {"model": "m", "api_key_env": "FLOWTUNE_TEST_NO_SUCH_KEY"}});
    assert!(err(missing).contains("FLOWTUNE_TEST_NO_SUCH_KEY, which is not set"));
    // A key over plain HTTP to a host that is not loopback: refused before any connection.
    let remote = json!({"name": "vlm_judge", "url": "http://judge.example:8000/v1/chat/completions",
        "vlm": {"model": "m", "api_key_env": "FLOWTUNE_TEST_NO_SUCH_KEY"}});
    assert!(err(remote).contains("vlm.api_key_env would send credentials in the clear"));
    let scale =
        json!({"name": "vlm_judge", "url": url, "vlm": {"model": "m", "score_range": [5, 1]}});
    assert!(err(scale).contains("vlm.score_range [5, 1]"));
    let misplaced = json!({"name": "jpeg_compressibility", "vlm": {"model": "m"}});
    assert!(err(misplaced).contains("`vlm` applies only to vlm_judge"));
    let fine = json!({"name": "vlm_judge", "url": url, "vlm": {"model": "m", "mode": "score"}});
    assert_eq!(build(&config(fine)).unwrap()[0].0.name(), "vlm_judge");
}
