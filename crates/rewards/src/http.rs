//! The HTTP reward client: any external scorer behind a small JSON protocol.
//!
//! Request (POST, JSON): `{"images": [base64 PNG, …], "prompts": [...], "metadata": [{"ground_truth",
//! "data_source", "extra_info"}, …]}`, and for a family with sound (LTX-2) `"audio": [base64 WAV,
//! …]` (16-bit PCM, the vocoder's rate and channels; a video's frames lie side by side in its
//! image). Response: `{"scores": [number, …]}` with one score per image,
//! optionally `"extras": {"name": [number, …]}` (logged as `critic/<name>/mean`). Requests carry
//! at most `batch_size` samples, at most `max_concurrency` run at once, each with a timeout and
//! bounded retries with doubling backoff (none after a TLS failure), over plain HTTP or TLS
//! (`crate::endpoint`). A scorer that stays down, times out, fails the TLS handshake or answers
//! anything else is an error naming the URL and what went wrong.

use std::io::Cursor;
use std::time::Duration;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::endpoint::{check_url, tls_config, tls_failure};
use crate::{Reward, RewardError, Sample, Score};

/// How the HTTP reward client talks to a scorer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSettings {
    /// Seconds one request may take.
    pub timeout_s: f64,
    /// Retries after a failed request (connection error, timeout, HTTP error), with doubling
    /// backoff; a TLS failure is not retried.
    pub max_retries: u32,
    /// Seconds before the first retry.
    pub backoff_s: f64,
    /// Samples per request.
    pub batch_size: usize,
    /// Requests in flight at once.
    pub max_concurrency: usize,
    /// `https://`: a PEM file of CA certificates to trust besides the bundled and system roots,
    /// `$SSL_CERT_FILE` and `$REQUESTS_CA_BUNDLE`; a certificate listed in any of them is also
    /// accepted as the server's own when it is a CA (`openssl req -x509`). A relative path is
    /// taken from the recipe file's folder, as every input path of a recipe is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<std::path::PathBuf>,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            timeout_s: 60.0,
            max_retries: 2,
            backoff_s: 0.5,
            batch_size: 16,
            max_concurrency: 4,
            ca_file: None,
        }
    }
}

/// A scorer reached over HTTP.
pub struct HttpReward {
    url: String,
    settings: HttpSettings,
    agent: ureq::Agent,
}

/// The image as base64 PNG.
pub(crate) fn png_base64(image: &crate::RgbImage) -> Result<String, String> {
    let mut png = Cursor::new(Vec::new());
    image.write_to(&mut png, image::ImageFormat::Png).map_err(|e| format!("encoding PNG: {e}"))?;
    Ok(base64::engine::general_purpose::STANDARD.encode(png.into_inner()))
}

/// Checks the endpoint and client settings of reward `name`; the agent to use. `credential` names
/// the setting that adds an `Authorization` header, if any (see [`check_url`]).
pub(crate) fn client(
    name: &str,
    url: &str,
    settings: &HttpSettings,
    credential: Option<&str>,
) -> Result<ureq::Agent, RewardError> {
    let tls = check_url(name, url, credential)?;
    if settings.batch_size == 0
        || settings.max_concurrency == 0
        || !(settings.timeout_s > 0.0 && settings.timeout_s.is_finite())
        || !(settings.backoff_s >= 0.0 && settings.backoff_s.is_finite())
    {
        return Err(RewardError::Config(format!(
            "reward `{name}`: batch_size, max_concurrency and timeout_s must be > 0, backoff_s ≥ 0"
        )));
    }
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs_f64(settings.timeout_s));
    Ok(if tls { agent.tls_config(tls_config(name, settings.ca_file.as_deref())?) } else { agent }
        .build())
}

/// POSTs `body` as JSON with `headers`, retrying connection errors, timeouts and HTTP errors
/// `settings.max_retries` times with doubling backoff; the answer's text, or what went wrong. A
/// TLS failure (refused certificate, failed handshake) is final: it is returned at once.
pub(crate) fn post_with_retries(
    agent: &ureq::Agent,
    url: &str,
    headers: &[(String, String)],
    body: &Value,
    settings: &HttpSettings,
) -> Result<String, String> {
    let mut delay = settings.backoff_s;
    let mut attempt = 0;
    loop {
        let request = headers.iter().fold(agent.post(url), |r, (k, v)| r.set(k, v));
        let error = match request.send_json(body.clone()) {
            Ok(response) => match response.into_string() {
                Ok(text) => return Ok(text),
                Err(e) => format!("reading the answer: {e}"),
            },
            Err(ureq::Error::Status(code, response)) => {
                let text = response.into_string().unwrap_or_default();
                format!("HTTP {code}: {}", text.chars().take(200).collect::<String>())
            }
            Err(e) => match tls_failure(&e) {
                Some(tls) => return Err(tls),
                None => e.to_string(),
            },
        };
        if attempt >= settings.max_retries {
            return Err(format!("{error} (after {} attempts)", attempt + 1));
        }
        attempt += 1;
        std::thread::sleep(Duration::from_secs_f64(delay));
        delay *= 2.0;
    }
}

/// Runs `work` on every item, at most `max_concurrency` at once; results in item order. `reward`
/// names the scorer in the error of a request thread that panicked.
pub(crate) fn in_waves<T: Sync, R: Send>(
    reward: &str,
    items: &[T],
    max_concurrency: usize,
    work: impl Fn(&T) -> Result<R, RewardError> + Sync,
) -> Vec<Result<R, RewardError>> {
    let mut results = Vec::with_capacity(items.len());
    for wave in items.chunks(max_concurrency.max(1)) {
        std::thread::scope(|scope| {
            let handles: Vec<_> = wave.iter().map(|item| scope.spawn(|| work(item))).collect();
            for h in handles {
                results.push(h.join().unwrap_or_else(|_| {
                    Err(RewardError::Failed {
                        reward: reward.into(),
                        message: "a request thread panicked".into(),
                    })
                }));
            }
        });
    }
    results
}

impl HttpReward {
    pub fn new(url: String, settings: HttpSettings) -> Result<Self, RewardError> {
        let agent = client("http", &url, &settings, None)?;
        Ok(Self { url, settings, agent })
    }

    fn fail(&self, message: String) -> RewardError {
        RewardError::Failed { reward: format!("http {}", self.url), message }
    }

    fn body(&self, samples: &[Sample<'_>]) -> Result<Value, RewardError> {
        let mut images = vec![];
        for s in samples {
            images.push(png_base64(s.image).map_err(|e| self.fail(e))?);
        }
        let prompts: Vec<&str> = samples.iter().map(|s| s.prompt).collect();
        let metadata: Vec<Value> = samples
            .iter()
            .map(|s| json!({ "ground_truth": s.ground_truth, "data_source": s.data_source, "extra_info": s.extra_info }))
            .collect();
        let mut body = json!({ "images": images, "prompts": prompts, "metadata": metadata });
        if samples.iter().any(|s| s.audio.is_some()) {
            let audio = samples
                .iter()
                .map(|s| match s.audio {
                    Some(w) => w
                        .wav()
                        .map(|b| Value::from(base64::engine::general_purpose::STANDARD.encode(b)))
                        .map_err(|e| self.fail(e.to_string())),
                    None => Ok(Value::Null),
                })
                .collect::<Result<Vec<_>, _>>()?;
            body["audio"] = Value::from(audio);
        }
        Ok(body)
    }

    /// One request with retries.
    fn request(&self, samples: &[Sample<'_>]) -> Result<Vec<Score>, RewardError> {
        let body = self.body(samples)?;
        let text = post_with_retries(&self.agent, &self.url, &[], &body, &self.settings)
            .map_err(|e| self.fail(e))?;
        self.parse(&text, samples.len())
    }

    fn parse(&self, text: &str, expected: usize) -> Result<Vec<Score>, RewardError> {
        let garbage = |why: &str| {
            self.fail(format!(
                "{why}; expected {{\"scores\": [{expected} numbers]}}, got {:?}",
                text.chars().take(200).collect::<String>()
            ))
        };
        let v: Value = serde_json::from_str(text).map_err(|_| garbage("the answer is not JSON"))?;
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
        let mut scores = Vec::with_capacity(samples.len());
        for r in
            in_waves("http", &chunks, self.settings.max_concurrency, |chunk| self.request(chunk))
        {
            scores.extend(r?);
        }
        Ok(scores)
    }
}
