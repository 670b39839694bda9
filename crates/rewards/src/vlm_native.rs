//! `vlm_judge` with `backend: native`: the judge (Qwen2.5-VL or Qwen3-VL) runs in this process
//! on `vlm.device`, in `vlm.dtype`, `vlm.batch_size` pictures at a time: greedy answers with a
//! key-value cache (modes `ocr` and `score`, parsed as the OpenAI-API judge parses them), or the
//! probabilities of the score tokens as the first answer token (mode `expectation`). With
//! `vlm.offload` the weights wait on the host between scorings.

use std::path::Path;
use std::sync::Mutex;

use flowtune_models::vlm::generate::{first_token_probabilities, generate};
use flowtune_models::vlm::VisionLanguageModel;
use tch::{Device, Kind};

use crate::vlm::{JudgeMode, VlmSettings};
use crate::{Reward, RewardError, Sample, Score};

/// An in-process vision-language judge.
pub struct NativeJudge {
    model: Mutex<VisionLanguageModel>,
    vlm: VlmSettings,
    device: Device,
    /// `expectation` mode: each score token's id and value.
    score_tokens: Vec<(i64, f64)>,
}

// SAFETY: the weights are frozen and only read under the mutex; libtorch tensors may move
// between threads.
unsafe impl Send for NativeJudge {}
unsafe impl Sync for NativeJudge {}

/// The tensor kind of a dtype name (`bfloat16`, `float16`, `float32`, or their short forms).
pub(crate) fn kind_named(name: &str) -> Option<Kind> {
    match name {
        "bfloat16" | "bf16" => Some(Kind::BFloat16),
        "float16" | "fp16" | "half" => Some(Kind::Half),
        "float32" | "fp32" | "float" => Some(Kind::Float),
        _ => None,
    }
}

/// The checkpoint's `dtype` (or the older `torch_dtype`) in `config.json`.
fn checkpoint_kind(dir: &Path) -> Option<Kind> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let config: serde_json::Value = serde_json::from_str(&text).ok()?;
    let name = config["dtype"].as_str().or(config["torch_dtype"].as_str())?;
    kind_named(name)
}

impl NativeJudge {
    /// Checks the settings, then loads the judge for `vlm.device`, else `default` (the training
    /// device), on the host when `offload`.
    pub fn new(vlm: VlmSettings, default: Device) -> Result<Self, RewardError> {
        vlm.check()?;
        let config = |m: String| RewardError::Config(format!("reward `vlm_judge`: {m}"));
        let device = crate::clip::device_named(vlm.device.as_deref(), "vlm.device", default)
            .map_err(config)?;
        let fail =
            |m: String| RewardError::Failed { reward: "vlm_judge (native)".into(), message: m };
        let dir = flowtune_models::hub::resolve(Path::new(&vlm.model))
            .map_err(|e| fail(format!("vlm.model: {e}")))?;
        let kind = match vlm.dtype.as_deref() {
            Some(name) => kind_named(name).ok_or_else(|| {
                config(format!("vlm.dtype `{name}`: expected bfloat16, float16 or float32"))
            })?,
            None if device == Device::Cpu => Kind::Float,
            None => checkpoint_kind(&dir).unwrap_or(Kind::BFloat16),
        };
        let home = if vlm.offload { Device::Cpu } else { device };
        let model = VisionLanguageModel::load(&dir, home, kind)
            .map_err(|e| fail(format!("loading the judge {}: {e}", dir.display())))?;
        let mut score_tokens = vec![];
        for (token, &value) in &vlm.score_tokens {
            let ids = model.tokenizer.ids(token).map_err(|e| fail(e.to_string()))?;
            let [id] = ids[..] else {
                return Err(config(format!(
                    "vlm.score_tokens: {token:?} is {} tokens of {}; each must be one token",
                    ids.len(),
                    dir.display()
                )));
            };
            score_tokens.push((i64::from(id), value));
        }
        Ok(Self { model: Mutex::new(model), vlm, device, score_tokens })
    }

    fn fail(&self, message: String) -> RewardError {
        RewardError::Failed { reward: "vlm_judge (native)".into(), message }
    }

    /// Scores of `samples` (indices from `first`) by one batch of the judge.
    fn score_batch(
        &self,
        model: &VisionLanguageModel,
        first: usize,
        samples: &[Sample<'_>],
    ) -> Result<Vec<Score>, RewardError> {
        let v = &self.vlm;
        let users: Vec<String> =
            samples.iter().map(|s| v.user_prompt.replace("{prompt}", s.prompt)).collect();
        let system = (!v.system_prompt.is_empty()).then_some(v.system_prompt.as_str());
        let rows: Vec<_> =
            samples.iter().zip(&users).map(|(s, u)| (s.image, system, u.as_str())).collect();
        let prompts =
            model.prompts(&rows, &v.answer_prefix).map_err(|e| self.fail(e.to_string()))?;
        if v.mode == JudgeMode::Expectation {
            let ids: Vec<i64> = self.score_tokens.iter().map(|(id, _)| *id).collect();
            let probs = first_token_probabilities(model, &prompts, &ids)
                .map_err(|e| self.fail(e.to_string()))?;
            let probs =
                Vec::<f32>::try_from(probs.reshape([-1])).map_err(|e| self.fail(e.to_string()))?;
            let [lo, hi] = v.score_range;
            return probs
                .chunks(ids.len())
                .enumerate()
                .map(|(k, p)| {
                    let mass: f64 = p.iter().map(|&x| f64::from(x)).sum();
                    if mass.is_nan() || mass <= 0.0 {
                        return Err(self.fail(format!(
                            "sample {}: the score tokens have no probability",
                            first + k
                        )));
                    }
                    let expected = p
                        .iter()
                        .zip(&self.score_tokens)
                        .map(|(&x, (_, value))| f64::from(x) * value)
                        .sum::<f64>()
                        / mass;
                    let extras = [("vlm_judge/score_token_mass".to_string(), mass)].into();
                    Ok(Score { value: (expected - lo) / (hi - lo), extras })
                })
                .collect();
        }
        let answers = generate(model, &prompts, v.max_tokens as usize)
            .map_err(|e| self.fail(e.to_string()))?;
        samples
            .iter()
            .zip(answers)
            .enumerate()
            .map(|(k, (sample, tokens))| {
                let ids: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
                let answer =
                    model.tokenizer.decode(&ids, true).map_err(|e| self.fail(e.to_string()))?;
                let value = v.answer_score(first + k, sample, &answer).map_err(|m| self.fail(m))?;
                let extras = [("vlm_judge/answer_tokens".to_string(), tokens.len() as f64)].into();
                Ok(Score { value, extras })
            })
            .collect()
    }
}

impl Reward for NativeJudge {
    fn name(&self) -> &str {
        "vlm_judge"
    }

    fn score(&self, samples: &[Sample<'_>]) -> Result<Vec<Score>, RewardError> {
        let mut model = self.model.lock().unwrap_or_else(|e| e.into_inner());
        if self.vlm.offload {
            model.to_device(self.device);
        }
        let mut scores = vec![];
        let mut result = Ok(());
        for (b, batch) in samples.chunks(self.vlm.batch_size).enumerate() {
            match self.score_batch(&model, b * self.vlm.batch_size, batch) {
                Ok(s) => scores.extend(s),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if self.vlm.offload {
            model.to_device(Device::Cpu);
        }
        result.map(|()| scores)
    }
}
