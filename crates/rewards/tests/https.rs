//! The `http` reward and `vlm_judge` over TLS, against a server on 127.0.0.1 with a self-signed
//! certificate made here: refused at once, without retries, until its certificate is trusted
//! (`http.ca_file`, `$SSL_CERT_FILE` or `$REQUESTS_CA_BUNDLE`), then scores, also when the
//! certificate is a CA as `openssl req -x509` makes them, if it names the host and is current; the
//! key sent; retries and timeouts as over plain HTTP. Every request goes to 127.0.0.1.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use flowtune_rewards::{
    score_batch, HttpReward, HttpSettings, JudgeMode, OnError, Reward, RgbImage, Sample, VlmJudge,
    VlmSettings,
};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{json, Value};

/// An HTTPS server on 127.0.0.1: its port, the PEM file of its certificate, the connections it
/// accepted and the headers of each request it read.
struct Server {
    port: u16,
    ca: tempfile::NamedTempFile,
    connections: Arc<AtomicUsize>,
    headers: Arc<Mutex<Vec<String>>>,
}

/// A server's certificate (PEM) and private key.
struct Identity {
    pem: String,
    key: PrivateKeyDer<'static>,
}

/// A self-signed certificate of `params`, signed with a fresh key.
fn rcgen_identity(params: CertificateParams) -> Identity {
    let key = rcgen::KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    Identity { pem, key: PrivatePkcs8KeyDer::from(key.serialize_der()).into() }
}

/// `names` in the subjectAltName (and the common name 127.0.0.1), self-signed, CA:TRUE.
fn ca_params(names: &[&str]) -> CertificateParams {
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, "127.0.0.1");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
}

/// `openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=127.0.0.1` with `extra` arguments: a
/// self-signed CA:TRUE certificate; None when there is no `openssl` to run.
fn openssl_identity(extra: &[&str]) -> Option<Identity> {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let status = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1"])
        .args(extra)
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(Stdio::null())
        .status()
        .ok()?;
    assert!(status.success(), "openssl req -x509 {extra:?}");
    let pem = std::fs::read_to_string(cert).unwrap();
    Some(Identity { pem, key: PrivateKeyDer::from_pem_file(key).unwrap() })
}

/// A server with rcgen's plain self-signed certificate for 127.0.0.1 (not a CA).
fn server(fail: fn(usize) -> bool, delay: fn(usize) -> f64) -> Server {
    let params = CertificateParams::new(vec!["127.0.0.1".into()]).unwrap();
    serve(rcgen_identity(params), fail, delay)
}

/// Answers request n (0-based) after `delay(n)` seconds: HTTP 500 when `fail(n)`, else the `http`
/// protocol's scores (one per image) or, on /v1/chat/completions, a judge saying "Final Score: 4".
fn serve(identity: Identity, fail: fn(usize) -> bool, delay: fn(usize) -> f64) -> Server {
    let mut ca = tempfile::NamedTempFile::new().unwrap();
    ca.write_all(identity.pem.as_bytes()).unwrap();
    let cert = CertificateDer::from_pem_slice(identity.pem.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], identity.key)
        .unwrap();
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let headers = Arc::new(Mutex::new(vec![]));
    let connections = Arc::new(AtomicUsize::new(0));
    let (log, count, accepted) =
        (headers.clone(), Arc::new(AtomicUsize::new(0)), connections.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            accepted.fetch_add(1, Ordering::SeqCst);
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
    Server { port, ca, connections, headers }
}

/// Makes a client with the process's `vars` set, and no other test of this file changing them:
/// clients read `$SSL_CERT_FILE` and `$REQUESTS_CA_BUNDLE` when made, so every client here is made
/// through this.
fn with_env<R>(vars: &[(&str, &Path)], make: impl FnOnce() -> R) -> R {
    static ENV: Mutex<()> = Mutex::new(());
    let _only_us = ENV.lock().unwrap_or_else(PoisonError::into_inner);
    for (var, value) in vars {
        std::env::set_var(var, value);
    }
    let made = make();
    for (var, _) in vars {
        std::env::remove_var(var);
    }
    made
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
        audio: None,
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

/// Settings that would retry twice, a second apart, trusting `ca_file` if given.
fn patient(ca_file: Option<&Path>) -> HttpSettings {
    HttpSettings { max_retries: 2, backoff_s: 1.0, ca_file: ca_file.map(Into::into), ..quick() }
}

/// Scores 2 samples (one request) with the `http` reward at `s`, made with `settings` and the
/// process's `vars`: the number of scores, or the error.
fn score(s: &Server, settings: HttpSettings, vars: &[(&str, &Path)]) -> Result<usize, String> {
    let url = format!("https://127.0.0.1:{}/score", s.port);
    let reward = with_env(vars, || HttpReward::new(url, settings)).unwrap();
    let image = RgbImage::new(8, 8);
    reward.score(&samples(&image, 2)).map(|s| s.len()).map_err(|e| e.to_string())
}

/// The error of [`score`], checked to be a TLS refusal on one line that came at once: one
/// connection, no retry.
fn refusal(s: &Server, settings: HttpSettings, vars: &[(&str, &Path)]) -> String {
    let before = s.connections.load(Ordering::SeqCst);
    let err = score(s, settings, vars).unwrap_err();
    assert!(
        err.contains(&format!("`http https://127.0.0.1:{}/score`: TLS handshake failed: ", s.port))
            && !err.contains('\n')
            && !err.contains("attempts"),
        "{err}"
    );
    assert_eq!(s.connections.load(Ordering::SeqCst) - before, 1, "retried: {err}");
    err
}

#[test]
fn scores_arrive_over_https_only_when_the_servers_certificate_is_trusted() {
    let s = server(never, no_delay);
    let url = format!("https://127.0.0.1:{}/score", s.port);
    let image = RgbImage::new(8, 8);
    let five = samples(&image, 5);

    let untrusting = with_env(&[], || HttpReward::new(url.clone(), patient(None))).unwrap();
    let err = untrusting.score(&five).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "reward `http {url}`: TLS handshake failed: invalid peer certificate: UnknownIssuer \
             (trust the server's CA with http.ca_file, $SSL_CERT_FILE or $REQUESTS_CA_BUNDLE)"
        )
    );
    assert_eq!(s.connections.load(Ordering::SeqCst), 3, "one per batch of 2, none retried");
    // Under skip_sample the refusal drops the samples and is counted, never scored 0.
    let scorers: Vec<(Box<dyn Reward>, f64)> = vec![(Box::new(untrusting), 1.0)];
    let out = score_batch(&scorers, &five, OnError::SkipSample).unwrap();
    assert!(out.totals.iter().all(Option::is_none));
    assert!(s.headers.lock().unwrap().is_empty(), "no request got through");

    let trusting = HttpSettings { ca_file: Some(s.ca.path().into()), ..quick() };
    let scores = with_env(&[], || HttpReward::new(url.clone(), trusting)).unwrap().score(&five);
    assert_eq!(scores.unwrap().iter().map(|s| s.value).collect::<Vec<_>>(), [0.5; 5]);
    assert_eq!(s.headers.lock().unwrap().len(), 3, "batches of 2");

    // The variables OpenSSL and Python's requests read do the same.
    for var in ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"] {
        assert_eq!(score(&s, quick(), &[(var, s.ca.path())]), Ok(2), "{var}");
    }
}

/// The certificate `openssl req -x509` makes (CA:TRUE), which curl and Python accept when told
/// to trust it: so does flowtune, by `$SSL_CERT_FILE` or `http.ca_file`, if it names the host.
#[test]
fn an_openssl_req_x509_certificate_is_accepted_once_trusted() {
    let Some(identity) = openssl_identity(&["-addext", "subjectAltName=IP:127.0.0.1"]) else {
        eprintln!("skipped: no openssl to run");
        return;
    };
    let s = serve(identity, never, no_delay);
    let err = refusal(&s, patient(None), &[]);
    assert!(
        err.ends_with(
            "TLS handshake failed: the server presents a CA certificate as its own, accepted \
             only when that very certificate is listed in http.ca_file, $SSL_CERT_FILE or \
             $REQUESTS_CA_BUNDLE"
        ),
        "{err}"
    );
    assert_eq!(score(&s, patient(None), &[("SSL_CERT_FILE", s.ca.path())]), Ok(2));
    assert_eq!(score(&s, patient(Some(s.ca.path())), &[]), Ok(2));
    assert_eq!(s.headers.lock().unwrap().len(), 2);

    // Trusted, but for localhost only, or for no name (the common name alone): refused.
    for (san, names) in [
        (
            &["-addext", "subjectAltName=DNS:localhost"][..],
            "is only valid for DnsName(\"localhost\")",
        ),
        (&[], "is not valid for any names"),
    ] {
        let s = serve(openssl_identity(san).unwrap(), never, no_delay);
        let err = refusal(&s, patient(None), &[("SSL_CERT_FILE", s.ca.path())]);
        assert!(
            err.contains(&format!(
                "certificate not valid for name \"127.0.0.1\"; certificate {names}"
            )),
            "{err}"
        );
    }
}

/// A CA certificate passes as the server's own only when it is byte for byte one the user
/// listed, names the host and is current.
#[test]
fn a_listed_ca_certificate_must_be_the_servers_name_the_host_and_be_current() {
    let s = serve(rcgen_identity(ca_params(&["127.0.0.1"])), never, no_delay);
    assert!(refusal(&s, patient(None), &[]).contains("presents a CA certificate as its own"));
    assert_eq!(score(&s, patient(Some(s.ca.path())), &[]), Ok(2));
    let other = serve(rcgen_identity(ca_params(&["127.0.0.1"])), never, no_delay);
    let err = refusal(&s, patient(Some(other.ca.path())), &[("SSL_CERT_FILE", other.ca.path())]);
    assert!(err.contains("presents a CA certificate as its own"), "{err}");

    let dated = |from: i32, to: i32| {
        let mut params = ca_params(&["127.0.0.1"]);
        params.not_before = rcgen::date_time_ymd(from, 1, 1);
        params.not_after = rcgen::date_time_ymd(to, 1, 1);
        params
    };
    for (params, why) in [
        (ca_params(&["localhost"]), "not valid for name \"127.0.0.1\""),
        (ca_params(&[]), "not valid for name \"127.0.0.1\""),
        (dated(2000, 2001), "certificate expired"),
        (dated(2090, 2091), "certificate not valid yet"),
    ] {
        let s = serve(rcgen_identity(params), never, no_delay);
        let err = refusal(&s, patient(Some(s.ca.path())), &[]);
        assert!(err.contains(why), "{err}");
    }
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
        with_env(&[], || VlmJudge::new(url, vlm.clone(), http)).unwrap()
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
