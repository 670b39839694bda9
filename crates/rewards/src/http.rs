//! The HTTP reward client: any external scorer behind a small JSON protocol.
//!
//! Request (POST, JSON): `{"images": [base64 PNG, …], "prompts": [...], "metadata": [{"ground_truth",
//! "data_source", "extra_info"}, …]}`. Response: `{"scores": [number, …]}` with one score per image,
//! optionally `"extras": {"name": [number, …]}` (logged as `critic/<name>/mean`). Requests carry
//! at most `batch_size` samples, at most `max_concurrency` run at once, each with a timeout and
//! bounded retries with doubling backoff. A scorer that stays down, times out or answers anything
//! else is an error naming the URL and what went wrong.

use std::io::Cursor;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::{HttpSettings, Reward, RewardError, Sample, Score};

/// A scorer reached over HTTP.
pub struct HttpReward {
    url: String,
    settings: HttpSettings,
    agent: ureq::Agent,
}

impl HttpReward {
    pub fn new(url: String, settings: HttpSettings) -> Result<Self, RewardError> {
        if !url.starts_with("http://") {
            return Err(RewardError::Config(format!("reward `http`: url {url:?} must start with http:// (serve the scorer over plain HTTP, e.g. on localhost)")));
        }
        if settings.batch_size == 0
            || settings.max_concurrency == 0
            || !(settings.timeout_s > 0.0 && settings.timeout_s.is_finite())
            || !(settings.backoff_s >= 0.0 && settings.backoff_s.is_finite())
        {
            return Err(RewardError::Config(
                "reward `http`: batch_size, max_concurrency and timeout_s must be > 0, backoff_s ≥ 0".into(),
            ));
        }
        let agent =
            ureq::AgentBuilder::new().timeout(Duration::from_secs_f64(settings.timeout_s)).build();
        Ok(Self { url, settings, agent })
    }

    fn fail(&self, message: String) -> RewardError {
        RewardError::Failed { reward: format!("http {}", self.url), message }
    }

    fn body(&self, samples: &[Sample<'_>]) -> Result<Value, RewardError> {
        let mut images = vec![];
        for s in samples {
            let mut png = Cursor::new(Vec::new());
            s.image
                .write_to(&mut png, image::ImageFormat::Png)
                .map_err(|e| self.fail(format!("encoding PNG: {e}")))?;
            images.push(base64::engine::general_purpose::STANDARD.encode(png.into_inner()));
        }
        let prompts: Vec<&str> = samples.iter().map(|s| s.prompt).collect();
        let metadata: Vec<Value> = samples
            .iter()
            .map(|s| json!({ "ground_truth": s.ground_truth, "data_source": s.data_source, "extra_info": s.extra_info }))
            .collect();
        Ok(json!({ "images": images, "prompts": prompts, "metadata": metadata }))
    }

    /// One request with retries.
    fn request(&self, samples: &[Sample<'_>]) -> Result<Vec<Score>, RewardError> {
        let body = self.body(samples)?;
        let mut delay = self.settings.backoff_s;
        let mut attempt = 0;
        loop {
            let outcome = self.agent.post(&self.url).send_json(body.clone());
            let error = match outcome {
                Ok(response) => return self.parse(response, samples.len()),
                Err(ureq::Error::Status(code, response)) => {
                    format!(
                        "HTTP {code}: {}",
                        response
                            .into_string()
                            .unwrap_or_default()
                            .chars()
                            .take(200)
                            .collect::<String>()
                    )
                }
                Err(e) => e.to_string(),
            };
            if attempt >= self.settings.max_retries {
                return Err(self.fail(format!("{error} (after {} attempts)", attempt + 1)));
            }
            attempt += 1;
            std::thread::sleep(Duration::from_secs_f64(delay));
            delay *= 2.0;
        }
    }

    fn parse(&self, response: ureq::Response, expected: usize) -> Result<Vec<Score>, RewardError> {
        let text =
            response.into_string().map_err(|e| self.fail(format!("reading the answer: {e}")))?;
        let garbage = |why: &str| {
            self.fail(format!(
                "{why}; expected {{\"scores\": [{expected} numbers]}}, got {:?}",
                text.chars().take(200).collect::<String>()
            ))
        };
        let v: Value =
            serde_json::from_str(&text).map_err(|_| garbage("the answer is not JSON"))?;
        let scores = v["scores"].as_array().ok_or_else(|| garbage("no `scores` list"))?;
        if scores.len() != expected {
            return Err(garbage(&format!("{} scores for {expected} images", scores.len())));
        }
        let mut out = Vec::with_capacity(expected);
        for (i, s) in scores.iter().enumerate() {
            // null (e.g. NaN on the server) stays NaN, so the failure policy sees it.
            let value = if s.is_null() {
                f64::NAN
            } else {
                s.as_f64().ok_or_else(|| garbage(&format!("score {i} is not a number")))?
            };
            let mut extras = std::collections::BTreeMap::new();
            if let Some(map) = v["extras"].as_object() {
                for (name, values) in map {
                    if let Some(x) = values.get(i).and_then(Value::as_f64) {
                        extras.insert(name.clone(), x);
                    }
                }
            }
            out.push(Score { value, extras });
        }
        Ok(out)
    }
}

impl Reward for HttpReward {
    fn name(&self) -> &str {
        "http"
    }

    fn score(&self, samples: &[Sample<'_>]) -> Result<Vec<Score>, RewardError> {
        let chunks: Vec<&[Sample<'_>]> = samples.chunks(self.settings.batch_size).collect();
        let mut results: Vec<Result<Vec<Score>, RewardError>> = Vec::with_capacity(chunks.len());
        for wave in chunks.chunks(self.settings.max_concurrency) {
            std::thread::scope(|scope| {
                let handles: Vec<_> =
                    wave.iter().map(|chunk| scope.spawn(move || self.request(chunk))).collect();
                for h in handles {
                    results
                        .push(h.join().unwrap_or_else(|_| {
                            Err(self.fail("a request thread panicked".into()))
                        }));
                }
            });
        }
        let mut scores = Vec::with_capacity(samples.len());
        for r in results {
            scores.extend(r?);
        }
        Ok(scores)
    }
}
