//! `vlm_judge`: a vision-language model looks at each image and answers; the answer becomes the
//! score. With `backend: openai` (the default) the model sits behind an OpenAI-compatible
//! chat-completions endpoint (vLLM, SGLang, …); with `backend: native` it runs in this process
//! ([`crate::NativeJudge`]).
//!
//! One request per image (`POST <url>` with `Authorization: Bearer $<api_key_env>` when set):
//! `{"model", "messages": [{"role": "system", "content": <system_prompt>} (unless empty), {"role": "user",
//! "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,…"}}, {"type":
//! "text", "text": <user_prompt>}]}], "temperature", "top_p", "max_tokens"[, "seed"]}`; the answer
//! is `choices[0].message.content`. `{prompt}` in the user prompt stands for the sample's prompt.
//!
//! Scoring modes:
//! - `ocr`: the answer is the text the model read; scored with [`crate::ocr_score`] against the
//!   sample's ground truth.
//! - `score`: the last number in the answer (pattern `\d+(\.\d+)?`, so `Final Score: 4` gives 4),
//!   which must lie in `score_range` `[lo, hi]`, mapped to `(x − lo) / (hi − lo)` in [0, 1]
//!   (UnifiedReward-style 1–5 scores by default).
//! - `expectation` (native only): no answer is decoded; the probabilities of the `score_tokens`
//!   as the first answer token (after `answer_prefix`), renormalised over them, weigh their
//!   values, and the expectation is mapped by `score_range` (1–5 digits, or yes/no as 1/0).
//!
//! A request that fails after its retries, an answer without a number, a number out of range, or
//! an OCR sample without a ground truth is an error naming the sample — never a score of 0.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::http::{client, in_waves, png_base64, post_with_retries};
use crate::ocr_score::score_read_text;
use crate::{HttpSettings, Reward, RewardError, Sample, Score};

/// How the judge's answer becomes a score.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum JudgeMode {
    /// The answer is the text in the image, scored against the ground truth.
    #[default]
    Ocr,
    /// The answer ends with a numeric score in `score_range`.
    Score,
    /// The expected value of the first answer token over `score_tokens` (`backend: native`).
    Expectation,
}

/// Where the judge runs.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum JudgeBackend {
    /// An OpenAI-compatible chat-completions server at the reward's `url`.
    #[default]
    Openai,
    /// In this process: `model` is a transformers Qwen2.5-VL or Qwen3-VL folder, or a Hub id in
    /// the local cache.
    Native,
}

/// `vlm:` settings of a `vlm_judge` reward.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct VlmSettings {
    pub backend: JudgeBackend,
    /// `openai`: the served model name. `native`: a transformers
    /// `Qwen2_5_VLForConditionalGeneration` or `Qwen3VLForConditionalGeneration` folder (relative
    /// to the recipe file), or a Hub id in the local Hugging Face cache.
    pub model: String,
    pub mode: JudgeMode,
    /// The system message of every request; empty: none (the chat template's default, if any).
    pub system_prompt: String,
    /// The instruction beside the image; `{prompt}` is replaced by the sample's prompt.
    pub user_prompt: String,
    /// The judge's sampling temperature (0: greedy).
    pub temperature: f64,
    /// The judge's nucleus-sampling `top_p`, in (0, 1].
    pub top_p: f64,
    /// The most tokens the judge may answer with.
    pub max_tokens: u32,
    /// The judge's sampling seed, sent with every request; unset: none sent.
    pub seed: Option<u64>,
    /// The environment variable holding the API key, sent as a bearer token; none by default.
    /// Refused over plain `http://` unless the host is loopback.
    pub api_key_env: Option<String>,
    /// `score` and `expectation` modes: the judge's scale `[lo, hi]`.
    pub score_range: [f64; 2],
    /// `expectation` mode: each score token (one token of the judge's vocabulary) and its value.
    pub score_tokens: BTreeMap<String, f64>,
    /// Text the answer starts with, written after the assistant's opening (`native`), so that a
    /// score token comes first (e.g. `"Final Score: "`).
    pub answer_prefix: String,
    /// `native`: `cpu`, `cuda` or `cuda:N`; default: the training device (this rank's GPU), else
    /// `cuda` when a GPU is present.
    pub device: Option<String>,
    /// `native`: the weights' dtype (`bfloat16`, `float16`, `float32`); default: the
    /// checkpoint's `dtype` on a GPU, `float32` on the CPU.
    pub dtype: Option<String>,
    /// `native`: keep the weights on the host between scorings (they move to `device` to score).
    pub offload: bool,
    /// `native`: pictures answered together.
    pub batch_size: usize,
}

impl Default for VlmSettings {
    /// VeRL-Omni's OCR judge.
    fn default() -> Self {
        Self {
            model: String::new(),
            mode: JudgeMode::Ocr,
            system_prompt: "You are a helpful assistant.".into(),
            user_prompt: "Please output only the text content from the image without any additional descriptions or formatting.".into(),
            temperature: 0.7,
            top_p: 0.8,
            max_tokens: 4096,
            seed: None,
            api_key_env: None,
            score_range: [1.0, 5.0],
            score_tokens: BTreeMap::new(),
            answer_prefix: String::new(),
            device: None,
            dtype: None,
            offload: false,
            batch_size: 8,
            backend: JudgeBackend::Openai,
        }
    }
}

/// A VLM judge reached over HTTP.
pub struct VlmJudge {
    url: String,
    vlm: VlmSettings,
    http: HttpSettings,
    headers: Vec<(String, String)>,
    agent: ureq::Agent,
}

impl VlmJudge {
    /// Checks the settings and reads the API key from its environment variable.
    pub fn new(url: String, vlm: VlmSettings, http: HttpSettings) -> Result<Self, RewardError> {
        let credential = vlm.api_key_env.as_ref().map(|_| "vlm.api_key_env");
        let agent = client("vlm_judge", &url, &http, credential)?;
        vlm.check()?;
        let mut headers = vec![];
        if let Some(var) = &vlm.api_key_env {
            let key = std::env::var(var).map_err(|_| {
                RewardError::Config(format!("reward `vlm_judge`: vlm.api_key_env names {var}, which is not set in the environment"))
            })?;
            headers.push(("Authorization".to_string(), format!("Bearer {key}")));
        }
        Ok(Self { url, vlm, http, headers, agent })
    }

    fn fail(&self, message: String) -> RewardError {
        RewardError::Failed { reward: format!("vlm_judge {}", self.url), message }
    }

    /// The chat-completions request for one sample.
    fn body(&self, sample: &Sample<'_>) -> Result<Value, RewardError> {
        let png = png_base64(sample.image).map_err(|e| self.fail(e))?;
        let v = &self.vlm;
        let mut messages = vec![];
        if !v.system_prompt.is_empty() {
            messages.push(json!({ "role": "system", "content": v.system_prompt }));
        }
        messages.push(json!({ "role": "user", "content": [
            { "type": "image_url", "image_url": { "url": format!("data:image/png;base64,{png}") } },
            { "type": "text", "text": v.user_prompt.replace("{prompt}", sample.prompt) },
        ] }));
        let mut body = json!({
            "model": v.model,
            "messages": messages,
            "temperature": v.temperature,
            "top_p": v.top_p,
            "max_tokens": v.max_tokens,
        });
        if let Some(seed) = v.seed {
            body["seed"] = json!(seed);
        }
        Ok(body)
    }

    /// Asks about sample `i` and scores the answer.
    fn judge(&self, i: usize, sample: &Sample<'_>) -> Result<Score, RewardError> {
        let body = self.body(sample)?;
        let text = post_with_retries(&self.agent, &self.url, &self.headers, &body, &self.http)
            .map_err(|e| self.fail(format!("sample {i}: {e}")))?;
        let excerpt = || text.chars().take(200).collect::<String>();
        let answer = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["choices"][0]["message"]["content"].as_str().map(str::to_string))
            .ok_or_else(|| {
                self.fail(format!(
                    "sample {i}: expected a chat completion with choices[0].message.content, got {:?}",
                    excerpt()
                ))
            })?;
        let value = self.vlm.answer_score(i, sample, &answer).map_err(|m| self.fail(m))?;
        Ok(Score { value, extras: Default::default() })
    }
}

impl VlmSettings {
    /// Checks the settings (before anything loads), for either backend.
    pub fn check(&self) -> Result<(), RewardError> {
        let bad = |m: String| Err(RewardError::Config(format!("reward `vlm_judge`: {m}")));
        let native = self.backend == JudgeBackend::Native;
        if self.model.is_empty() {
            return bad(if native {
                "vlm.model is empty; give the judge's transformers folder or Hub id".into()
            } else {
                "vlm.model is empty; give the served model name".into()
            });
        }
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(format!("vlm.temperature {} must be ≥ 0", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) || self.max_tokens == 0 {
            return bad("vlm.top_p must be in (0, 1] and vlm.max_tokens ≥ 1".into());
        }
        let [lo, hi] = self.score_range;
        if !(lo < hi && lo.is_finite() && hi.is_finite()) {
            return bad(format!("vlm.score_range [{lo}, {hi}] must have lo < hi"));
        }
        if native && self.temperature != 0.0 && self.mode != JudgeMode::Expectation {
            return bad(format!(
                "backend native answers greedily; set vlm.temperature: 0 (got {})",
                self.temperature
            ));
        }
        if !native {
            let local = [
                ("device", self.device.is_some()),
                ("dtype", self.dtype.is_some()),
                ("offload", self.offload),
                ("answer_prefix", !self.answer_prefix.is_empty()),
            ];
            if let Some((key, _)) = local.iter().find(|(_, given)| *given) {
                return bad(format!("vlm.{key} applies only to backend: native"));
            }
            if self.mode == JudgeMode::Expectation {
                return bad("mode expectation needs backend: native (token probabilities)".into());
            }
        }
        if self.batch_size == 0 {
            return bad("vlm.batch_size must be ≥ 1".into());
        }
        let expectation = self.mode == JudgeMode::Expectation;
        if expectation == self.score_tokens.is_empty() {
            return bad(if expectation {
                "mode expectation needs vlm.score_tokens, e.g. {\"1\": 1, …, \"5\": 5}".into()
            } else {
                "vlm.score_tokens applies only to mode: expectation".into()
            });
        }
        if let Some((token, value)) = self.score_tokens.iter().find(|(_, v)| !v.is_finite()) {
            return bad(format!("vlm.score_tokens[{token:?}] = {value} is not finite"));
        }
        Ok(())
    }

    /// The score in [0, 1] of sample `i`'s `answer` in mode `ocr` or `score`; why not, otherwise.
    pub fn answer_score(&self, i: usize, sample: &Sample<'_>, answer: &str) -> Result<f64, String> {
        match self.mode {
            JudgeMode::Ocr => score_read_text(i, sample, answer, |m| m),
            JudgeMode::Score => {
                let [lo, hi] = self.score_range;
                let x = last_number(answer)
                    .ok_or_else(|| format!("sample {i}: no score in the answer {answer:?}"))?;
                if !(lo..=hi).contains(&x) {
                    return Err(format!(
                        "sample {i}: score {x} is outside vlm.score_range [{lo}, {hi}] (answer {answer:?})"
                    ));
                }
                Ok((x - lo) / (hi - lo))
            }
            JudgeMode::Expectation => unreachable!("expectation scores token probabilities"),
        }
    }
}

/// The last match of `\d+(\.\d+)?` in `text`.
fn last_number(text: &str) -> Option<f64> {
    let chars: Vec<char> = text.chars().collect();
    let mut last = None;
    let mut i = 0;
    while i < chars.len() {
        if chars[i].is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            if i + 1 < chars.len() && chars[i] == '.' && chars[i + 1].is_ascii_digit() {
                i += 1;
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
            }
            last = chars[start..i].iter().collect::<String>().parse().ok();
        } else {
            i += 1;
        }
    }
    last
}

impl Reward for VlmJudge {
    fn name(&self) -> &str {
        "vlm_judge"
    }

    fn score(&self, samples: &[Sample<'_>]) -> Result<Vec<Score>, RewardError> {
        let indexed: Vec<(usize, &Sample<'_>)> = samples.iter().enumerate().collect();
        in_waves("vlm_judge", &indexed, self.http.max_concurrency, |(i, s)| self.judge(*i, s))
            .into_iter()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_number_is_the_score() {
        assert_eq!(last_number("Final Score: 4"), Some(4.0));
        assert_eq!(last_number("On a 1-5 scale I give 3.5."), Some(3.5));
        assert_eq!(last_number("Score 2. Reason: item 10 looks off; final: 5"), Some(5.0));
        assert_eq!(last_number("no idea"), None);
    }
}
