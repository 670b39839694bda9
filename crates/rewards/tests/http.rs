//! The HTTP reward client against the example server (`examples/reward_server.py`, a real local
//! process on 127.0.0.1): scores, batching, retries, and the errors for a server that is down,
//! too slow or answers garbage.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use flowtune_rewards::{
    score_batch, HttpReward, HttpSettings, OnError, Reward, RgbImage, Sample, Waveform,
};

struct Server(Child, u16);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn server(flags: &[&str]) -> Server {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/reward_server.py");
    let mut child = Command::new("python3")
        .arg(script)
        .args(["--port", "0"])
        .args(flags)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let port = line.trim().strip_prefix("listening on ").expect("port line").parse().unwrap();
    Server(child, port)
}

fn client(port: u16, settings: HttpSettings) -> HttpReward {
    HttpReward::new(format!("http://127.0.0.1:{port}/score"), settings).unwrap()
}

fn images() -> Vec<RgbImage> {
    (0..5u8)
        .map(|i| {
            RgbImage::from_fn(16, 16, |x, y| {
                image::Rgb([i * 40, (x * 16) as u8, (y * i as u32) as u8])
            })
        })
        .collect()
}

fn samples(images: &[RgbImage]) -> Vec<Sample<'_>> {
    images
        .iter()
        .map(|image| Sample {
            image,
            frames: 1,
            audio: None,
            prompt: "p",
            ground_truth: Some("x"),
            data_source: "t",
            extra_info: &serde_json::Value::Null,
        })
        .collect()
}

fn quick() -> HttpSettings {
    HttpSettings {
        timeout_s: 5.0,
        max_retries: 0,
        backoff_s: 0.05,
        batch_size: 2,
        max_concurrency: 2,
        ca_file: None,
    }
}

#[test]
fn scores_arrive_in_order_across_concurrent_batches() {
    let s = server(&[]);
    let imgs = images();
    let scores = client(s.1, quick()).score(&samples(&imgs)).unwrap();
    assert_eq!(scores.len(), 5);
    for (score, img) in scores.iter().zip(&imgs) {
        let mut png = std::io::Cursor::new(Vec::new());
        img.write_to(&mut png, image::ImageFormat::Png).unwrap();
        let kb = png.into_inner().len() as f64 / 1000.0;
        assert!((score.value + kb / 10.0).abs() < 1e-9, "score is −kB/10 of this sample's PNG");
        assert!((score.extras["png_kb"] - kb).abs() < 1e-9);
    }
}

/// A model with sound (LTX-2) sends each sample's waveform as a 16-bit WAV beside its frames; the
/// example server reads it back: its RMS level within the 16-bit rounding, and its length.
#[test]
fn sounds_travel_as_wav_files() {
    let s = server(&[]);
    let imgs = images();
    let sounds: Vec<Waveform> = (0..5)
        .map(|i| Waveform {
            channels: vec![
                (0..800).map(|k| 0.1 * i as f32 * ((k as f32) * 0.05).sin()).collect();
                2
            ],
            sample_rate: 16000,
        })
        .collect();
    let with_sound: Vec<Sample<'_>> = samples(&imgs)
        .into_iter()
        .zip(&sounds)
        .map(|(s, w)| Sample { audio: Some(w), ..s })
        .collect();
    let scores = client(s.1, quick()).score(&with_sound).unwrap();
    for (score, w) in scores.iter().zip(&sounds) {
        assert!((score.extras["audio_rms"] - w.mean_square().sqrt()).abs() < 1e-4, "{score:?}");
        assert!((score.extras["audio_seconds"] - 0.05).abs() < 1e-12);
    }
}

#[test]
fn transient_failures_are_retried() {
    let s = server(&["--fail-first", "1"]);
    let imgs = images();
    let retrying = HttpSettings { max_retries: 2, batch_size: 8, ..quick() };
    assert_eq!(client(s.1, retrying).score(&samples(&imgs)).unwrap().len(), 5);
    let s = server(&["--fail-first", "1"]);
    let err = client(s.1, HttpSettings { batch_size: 8, ..quick() })
        .score(&samples(&imgs))
        .unwrap_err()
        .to_string();
    assert!(err.contains("HTTP 500") && err.contains("after 1 attempts"), "{err}");
}

#[test]
fn down_slow_and_garbage_servers_are_clear_errors() {
    let imgs = images();
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let err = client(free, HttpSettings { max_retries: 1, ..quick() })
        .score(&samples(&imgs))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("http http://127.0.0.1:{free}/score"))
            && err.contains("after 2 attempts"),
        "{err}"
    );

    let slow = server(&["--delay", "2"]);
    let err = client(slow.1, HttpSettings { timeout_s: 0.3, ..quick() })
        .score(&samples(&imgs))
        .unwrap_err()
        .to_string();
    assert!(err.to_lowercase().contains("timed out"), "{err}");

    let garbage = server(&["--garbage"]);
    let err = client(garbage.1, quick()).score(&samples(&imgs)).unwrap_err().to_string();
    assert!(err.contains("the answer is not JSON") && err.contains("not a score"), "{err}");

    // Under `skip_sample` the same failure drops the samples and is counted, never scored 0.
    let scorers: Vec<(Box<dyn Reward>, f64)> = vec![(Box::new(client(garbage.1, quick())), 1.0)];
    let out = score_batch(&scorers, &samples(&imgs), OnError::SkipSample).unwrap();
    assert!(out.totals.iter().all(Option::is_none));
    assert_eq!(out.metrics()["critic/rewards/failed_scorers"], 1.0);
}
