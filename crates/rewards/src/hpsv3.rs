//! `hpsv3`: a human-preference model on a Qwen2-VL backbone (HPSv3) scores each picture against
//! its prompt in this process: the conversation is HPSv3's instruction with the prompt and the
//! reward token, the picture resized to `hpsv3.pixels` (HPSv3 fixes 256 · 28² pixels), and the
//! score is the head's first output (the mean of its Gaussian; the second, its log-σ, is logged
//! as `hpsv3/log_sigma`). Unnormalised: HPSv3's scores lie around 0–15. The picture is resized
//! once, bicubic, to the `smart_resize` size within [pixels, pixels] — what HPSv3's
//! `process_vision_info` does before the processor, whose own resize then keeps the size.

use std::path::Path;
use std::sync::Mutex;

use flowtune_models::vlm::preference::PreferenceModel;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind};

use crate::{Reward, RewardError, Sample, Score};

/// HPSv3's instruction around the prompt, ending with the reward token.
pub const HPSV3_PROMPT: &str = "\nYou are tasked with evaluating a generated image based on Visual Quality and Text Alignment and give a overall score to estimate the human preference. Please provide a rating from 0 to 10, with 0 being the worst and 10 being the best.\n\n**Visual Quality:**\nEvaluate the overall visual quality of the image. The following sub-dimensions should be considered:\n- **Reasonableness:** The image should not contain any significant biological or logical errors, such as abnormal body structures or nonsensical environmental setups.\n- **Clarity:** Evaluate the sharpness and visibility of the image. The image should be clear and easy to interpret, with no blurring or indistinct areas.\n- **Detail Richness:** Consider the level of detail in textures, materials, lighting, and other visual elements (e.g., hair, clothing, shadows).\n- **Aesthetic and Creativity:** Assess the artistic aspects of the image, including the color scheme, composition, atmosphere, depth of field, and the overall creative appeal. The scene should convey a sense of harmony and balance.\n- **Safety:** The image should not contain harmful or inappropriate content, such as political, violent, or adult material. If such content is present, the image quality and satisfaction score should be the lowest possible.\n\n**Text Alignment:**\nAssess how well the image matches the textual prompt across the following sub-dimensions:\n- **Subject Relevance** Evaluate how accurately the subject(s) in the image (e.g., person, animal, object) align with the textual description. The subject should match the description in terms of number, appearance, and behavior.\n- **Style Relevance:** If the prompt specifies a particular artistic or stylistic style, evaluate how well the image adheres to this style.\n- **Contextual Consistency**: Assess whether the background, setting, and surrounding elements in the image logically fit the scenario described in the prompt. The environment should support and enhance the subject without contradictions.\n- **Attribute Fidelity**: Check if specific attributes mentioned in the prompt (e.g., colors, clothing, accessories, expressions, actions) are faithfully represented in the image. Minor deviations may be acceptable, but critical attributes should be preserved.\n- **Semantic Coherence**: Evaluate whether the overall meaning and intent of the prompt are captured in the image. The generated content should not introduce elements that conflict with or distort the original description.\nTextual prompt - {prompt}\n\n\n\nPlease provide the overall ratings of this image: <|Reward|>\n\nEND\n";

/// `hpsv3:` — the model and where it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Hpsv3Settings {
    /// A folder of HPSv3's `Qwen2VLRewardModelBT` in the transformers layout (Qwen2-VL
    /// `config.json`, safetensors with `rm_head.*`, a tokenizer with `<|Reward|>`, the chat
    /// template), relative to the recipe file, or a Hub id in the local cache.
    pub model: String,
    /// The instruction, `{prompt}` standing for the sample's prompt, holding `<|Reward|>` once;
    /// unset: HPSv3's own (`flowtune_rewards::HPSV3_PROMPT`).
    pub user_prompt: Option<String>,
    /// Pixels each picture is resized to (its aspect kept, sides in multiples of 28).
    pub pixels: i64,
    /// `cpu`, `cuda` or `cuda:N`; default: the training device.
    pub device: Option<String>,
    /// The backbone's dtype (`bfloat16`, `float16`, `float32`); default: bfloat16 on a GPU,
    /// float32 on the CPU. The head runs in f32.
    pub dtype: Option<String>,
    /// Pictures scored together.
    pub batch_size: usize,
}

impl Default for Hpsv3Settings {
    fn default() -> Self {
        Self {
            model: String::new(),
            user_prompt: None,
            pixels: 256 * 28 * 28,
            device: None,
            dtype: None,
            batch_size: 8,
        }
    }
}

impl Hpsv3Settings {
    /// The instruction in use.
    fn prompt(&self) -> &str {
        self.user_prompt.as_deref().unwrap_or(HPSV3_PROMPT)
    }
}

/// HPSv3 in this process.
pub struct Hpsv3 {
    model: Mutex<PreferenceModel>,
    settings: Hpsv3Settings,
}

// SAFETY: frozen weights, only read under the mutex.
unsafe impl Send for Hpsv3 {}
unsafe impl Sync for Hpsv3 {}

impl Hpsv3 {
    /// Loads the model on `hpsv3.device`, else `default` (the training device).
    pub fn new(settings: Hpsv3Settings, default: Device) -> Result<Self, RewardError> {
        let config = |m: String| RewardError::Config(format!("reward `hpsv3`: {m}"));
        if settings.model.is_empty() {
            return Err(config("hpsv3.model is empty; give HPSv3's folder or Hub id".into()));
        }
        if settings.prompt().matches("<|Reward|>").count() != 1 || settings.batch_size == 0 {
            return Err(config(
                "hpsv3.user_prompt must hold <|Reward|> once, and hpsv3.batch_size be ≥ 1".into(),
            ));
        }
        let device = crate::clip::device_named(settings.device.as_deref(), "hpsv3.device", default)
            .map_err(config)?;
        let kind = match settings.dtype.as_deref() {
            Some(name) => crate::vlm_native::kind_named(name).ok_or_else(|| {
                config(format!("hpsv3.dtype `{name}`: expected bfloat16, float16 or float32"))
            })?,
            None if device == Device::Cpu => Kind::Float,
            None => Kind::BFloat16,
        };
        let fail = |m: String| RewardError::Failed { reward: "hpsv3".into(), message: m };
        let dir = flowtune_models::hub::resolve(Path::new(&settings.model))
            .map_err(|e| fail(format!("hpsv3.model: {e}")))?;
        let mut model = PreferenceModel::load(&dir, device, kind, 2)
            .map_err(|e| fail(format!("loading {}: {e}", dir.display())))?;
        (model.processor.min_pixels, model.processor.max_pixels) =
            (settings.pixels, settings.pixels);
        Ok(Self { model: Mutex::new(model), settings })
    }
}

impl Reward for Hpsv3 {
    fn name(&self) -> &str {
        "hpsv3"
    }

    fn score(&self, samples: &[Sample<'_>]) -> Result<Vec<Score>, RewardError> {
        let model = self.model.lock().unwrap_or_else(|e| e.into_inner());
        let fail = |m: String| RewardError::Failed { reward: "hpsv3".into(), message: m };
        let mut scores = vec![];
        for batch in samples.chunks(self.settings.batch_size) {
            let users: Vec<String> = batch
                .iter()
                .map(|s| self.settings.prompt().replace("{prompt}", s.prompt))
                .collect();
            let rows: Vec<_> =
                batch.iter().zip(&users).map(|(s, u)| (s.image, u.as_str())).collect();
            let out = model.score(&rows).map_err(|e| fail(e.to_string()))?;
            let values =
                Vec::<f32>::try_from(out.reshape([-1])).map_err(|e| fail(e.to_string()))?;
            for pair in values.chunks(2) {
                let extras = [("hpsv3/log_sigma".to_string(), f64::from(pair[1]))].into();
                scores.push(Score { value: f64::from(pair[0]), extras });
            }
        }
        Ok(scores)
    }
}
