//! The `http` reward and `vlm_judge` over TLS, against a server on 127.0.0.1 with a self-signed
//! certificate made here: refused until its certificate is trusted (`http.ca_file` or
//! `$REQUESTS_CA_BUNDLE`), then scores; the key sent; retries and timeouts as over plain HTTP.
//! Every request goes to 127.0.0.1.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flowtune_rewards::{
    score_batch, HttpReward, HttpSettings, JudgeMode, OnError, Reward, RgbImage, Sample, VlmJudge,
    VlmSettings,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{json, Value};

/// An HTTPS server on 127.0.0.1: its port, the PEM file of its certificate, the headers of each
/// request it read.
struct Server {
    port: u16,
    ca: tempfile::NamedTempFile,
    headers: Arc<Mutex<Vec<String>>>,
}

/// Answers request n (0-based) after `delay(n)` seconds: HTTP 500 when `fail(n)`, else the `http`
/// protocol's scores (one per image) or, on /v1/chat/completions, a judge saying "Final Score: 4".
fn server(fail: fn(usize) -> bool, delay: fn(usize) -> f64) -> Server {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
    let mut ca = tempfile::NamedTempFile::new().unwrap();
    ca.write_all(cert.cert.pem().as_bytes()).unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.signing_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let headers = Arc::new(Mutex::new(vec![]));
    let (log, count) = (headers.clone(), Arc::new(AtomicUsize::new(0)));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (config, log, count) = (config.clone(), log.clone(), count.clone());
            std::thread::spawn(move || {
                let Some((head, body)) = read_request(stream, config) else { return };
                let n = count.fetch_add(1, Ordering::SeqCst);
                log.lock().unwrap().push(head.0.clone());
                std::thread::sleep(Duration::from_secs_f64(delay(n)));
                let (code, text) =
                    if fail(n) { (500, "{}".into()) } else { answer(&head.0, &body) };
                let mut tls = head.1;
                let _ = write!(
                    tls,
                    "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                    text.len()
                );
                let _ = tls.flush();
            });
        }
    });
    Server { port, ca, headers }
}

type Tls = rustls::StreamOwned<rustls::ServerConnection, TcpStream>;

/// The lower-cased request head, the stream to answer on, and the JSON body; None when the
/// handshake or the request failed.
fn read_request(
    stream: TcpStream,
    config: Arc<rustls::ServerConfig>,
) -> Option<((String, Tls), Value)> {
    let tls = rustls::StreamOwned::new(rustls::ServerConnection::new(config).ok()?, stream);
    let mut reader = BufReader::new(tls);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        head.push_str(&line.to_lowercase());
    }
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))?;
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(((head, reader.into_inner()), serde_json::from_slice(&body).ok()?))
}

fn answer(head: &str, body: &Value) -> (u16, String) {
    if head.starts_with("post /v1/chat/completions") {
        let message = json!({ "role": "assistant", "content": "Final Score: 4" });
        return (200, json!({ "choices": [{ "message": message }] }).to_string());
    }
    let n = body["images"].as_array().map_or(0, Vec::len);
    (200, json!({ "scores": vec![0.5; n] }).to_string())
}

fn never(_: usize) -> bool {
    false
}

fn no_delay(_: usize) -> f64 {
    0.0
}

fn samples(image: &RgbImage, n: usize) -> Vec<Sample<'_>> {
    static NULL: Value = Value::Null;
    let s = Sample {
        image,
        frames: 1,
        prompt: "p",
        ground_truth: Some("x"),
        data_source: "t",
        extra_info: &NULL,
    };
    vec![s; n]
}

fn quick() -> HttpSettings {
    HttpSettings {
        timeout_s: 5.0,
        max_retries: 0,
        backoff_s: 0.05,
        batch_size: 2,
        ..Default::default()
    }
}

#[test]
fn scores_arrive_over_https_only_when_the_servers_certificate_is_trusted() {
    let s = server(never, no_delay);
    let url = format!("https://127.0.0.1:{}/score", s.port);
    let image = RgbImage::new(8, 8);
    let five = samples(&image, 5);

    let untrusting = HttpReward::new(url.clone(), quick()).unwrap();
    let err = untrusting.score(&five).unwrap_err().to_string();
    assert!(
        err.contains(&format!("`http {url}`: TLS handshake failed: invalid peer certificate"))
            && err.contains("http.ca_file"),
        "{err}"
    );
    // Under skip_sample the refusal drops the samples and is counted, never scored 0.
    let scorers: Vec<(Box<dyn Reward>, f64)> = vec![(Box::new(untrusting), 1.0)];
    let out = score_batch(&scorers, &five, OnError::SkipSample).unwrap();
    assert!(out.totals.iter().all(Option::is_none));
    assert!(s.headers.lock().unwrap().is_empty(), "no request got through");

    let trusting = HttpSettings { ca_file: Some(s.ca.path().into()), ..quick() };
    let scores = HttpReward::new(url.clone(), trusting).unwrap().score(&five).unwrap();
    assert_eq!(scores.iter().map(|s| s.value).collect::<Vec<_>>(), [0.5; 5]);
    assert_eq!(s.headers.lock().unwrap().len(), 3, "batches of 2");

    // The variable Python's requests reads does the same (set only in this test of this binary).
    std::env::set_var("REQUESTS_CA_BUNDLE", s.ca.path());
    let scored = HttpReward::new(url, quick()).unwrap().score(&five);
    std::env::remove_var("REQUESTS_CA_BUNDLE");
    assert_eq!(scored.unwrap().len(), 5);
}

#[test]
fn the_judge_sends_its_key_over_https_and_retries_failures_and_timeouts() {
    std::env::set_var("FLOWTUNE_TEST_HTTPS_KEY", "s3cret");
    let vlm = VlmSettings {
        model: "judge".into(),
        mode: JudgeMode::Score,
        api_key_env: Some("FLOWTUNE_TEST_HTTPS_KEY".into()),
        ..Default::default()
    };
    let image = RgbImage::new(8, 8);
    let one = samples(&image, 1);
    let judge = |s: &Server, http: HttpSettings| {
        let url = format!("https://127.0.0.1:{}/v1/chat/completions", s.port);
        let http = HttpSettings { ca_file: Some(s.ca.path().into()), ..http };
        VlmJudge::new(url, vlm.clone(), http).unwrap()
    };

    let first_fails = || server(|n| n == 0, no_delay);
    let s = first_fails();
    let retrying = HttpSettings { max_retries: 1, ..quick() };
    assert_eq!(judge(&s, retrying).score(&one).unwrap()[0].value, 0.75, "(4 − 1) / 4");
    let headers = s.headers.lock().unwrap();
    assert_eq!(headers.len(), 2);
    assert!(headers.iter().all(|h| h.contains("authorization: bearer s3cret")), "{headers:?}");
    let s = first_fails();
    let err = judge(&s, quick()).score(&one).unwrap_err().to_string();
    assert!(err.contains("HTTP 500") && err.contains("after 1 attempts"), "{err}");

    let first_slow = || server(never, |n| if n == 0 { 1.5 } else { 0.0 });
    let short = HttpSettings { timeout_s: 0.3, ..quick() };
    let s = first_slow();
    let retried = HttpSettings { max_retries: 1, ..short.clone() };
    assert_eq!(judge(&s, retried).score(&one).unwrap()[0].value, 0.75);
    let s = first_slow();
    let err = judge(&s, short).score(&one).unwrap_err().to_string();
    assert!(err.to_lowercase().contains("timed out"), "{err}");
}
