//! The reward registry: scorer names → constructors.

use tch::Device;

use crate::{
    Brightness, ClipKind, ClipReward, Hpsv3, HttpReward, JpegSize, JudgeBackend, Loudness,
    NativeJudge, OcrReward, PerFrame, Reward, RewardConfig, RewardError, RewardFunction,
    ShapesGeneval, VlmJudge, Weighted,
};

/// Every registered reward name.
pub const REWARD_NAMES: [&str; 12] = [
    "jpeg_compressibility",
    "jpeg_incompressibility",
    "brightness",
    "http",
    "shapes_geneval",
    "vlm_judge",
    "ocr",
    "clip_score",
    "pickscore",
    "aesthetic",
    "hpsv3",
    "loudness",
];

const HTTP_URL: &str = "`url: http(s)://host:port/path`";
/// `vlm_judge` needs both (but `url` with `backend: native`), so either missing names both.
const CHAT: &str = "`url: http(s)://host:port/v1/chat/completions` and `vlm: {model: …}`, or \
                    `vlm: {backend: native, model: <Qwen2.5-VL or Qwen3-VL folder>}`";
const CLIP: &str = "`clip: {model: <CLIPModel folder>}`";
const HPSV3: &str = "`hpsv3: {model: <HPSv3 folder or Hub id>}`";

/// The setting `f` needs, or an error saying what to write.
fn needs<'a, T>(
    f: &RewardFunction,
    value: &'a Option<T>,
    what: &str,
) -> Result<&'a T, RewardError> {
    value.as_ref().ok_or_else(|| RewardError::Config(format!("reward `{}` needs {what}", f.name)))
}

/// Checks a `reward` section without loading anything: names, weights, the settings each reward
/// needs, and settings given to a reward they do not apply to.
pub fn validate(config: &RewardConfig) -> Result<(), RewardError> {
    if config.functions.is_empty() {
        return Err(RewardError::Config(
            "reward.functions is empty; name at least one reward".into(),
        ));
    }
    for f in &config.functions {
        if f.frame_interval == 0 {
            return Err(RewardError::Config(format!(
                "reward `{}`: frame_interval 0; use 1 to score every frame of a video, k for every k-th",
                f.name
            )));
        }
        if !f.weight.is_finite() {
            return Err(RewardError::Config(format!(
                "reward `{}`: weight {} is not finite",
                f.name, f.weight
            )));
        }
        match f.name.as_str() {
            "http" => drop(needs(f, &f.url, HTTP_URL)?),
            "vlm_judge" => {
                let vlm = needs(f, &f.vlm, CHAT)?;
                match (vlm.backend, &f.url) {
                    (JudgeBackend::Openai, None) => drop(needs(f, &f.url, CHAT)?),
                    (JudgeBackend::Native, Some(_)) => {
                        return Err(RewardError::Config(
                            "reward `vlm_judge`: backend native runs the judge in this process; \
                             drop `url`"
                                .into(),
                        ))
                    }
                    _ => {}
                }
                vlm.check()?;
            }
            "clip_score" | "pickscore" | "aesthetic" => drop(needs(f, &f.clip, CLIP)?),
            "hpsv3" => drop(needs(f, &f.hpsv3, HPSV3)?),
            "loudness" => f.loudness.clone().unwrap_or_default().check()?,
            name if REWARD_NAMES.contains(&name) => {}
            other => {
                return Err(RewardError::Config(format!(
                    "unknown reward `{other}`; known: {}",
                    REWARD_NAMES.join(", ")
                )));
            }
        }
        // Each reward-specific setting, and the rewards it applies to.
        let specific: [(&str, bool, &[&str]); 6] = [
            ("partial", f.partial, &["shapes_geneval"]),
            ("vlm", f.vlm.is_some(), &["vlm_judge"]),
            ("ocr", f.ocr.is_some(), &["ocr"]),
            ("clip", f.clip.is_some(), &["clip_score", "pickscore", "aesthetic"]),
            ("hpsv3", f.hpsv3.is_some(), &["hpsv3"]),
            ("loudness", f.loudness.is_some(), &["loudness"]),
        ];
        for (key, given, owners) in specific {
            if given && !owners.contains(&f.name.as_str()) {
                return Err(RewardError::Config(format!(
                    "reward `{}`: `{key}` applies only to {}",
                    f.name,
                    owners.join(", ")
                )));
            }
        }
    }
    Ok(())
}

/// The weighted scorers of a `reward` section (validated first), with their models loaded; an
/// in-process model without a device setting goes to the GPU when there is one.
pub fn build(config: &RewardConfig) -> Result<Vec<Weighted>, RewardError> {
    build_on(config, Device::cuda_if_available())
}

/// [`build`], with the in-process models that name no device on `device` (the training device:
/// each rank's own GPU).
pub fn build_on(config: &RewardConfig, device: Device) -> Result<Vec<Weighted>, RewardError> {
    validate(config)?;
    config
        .functions
        .iter()
        .map(|f| {
            let scorer: Box<dyn Reward> = match f.name.as_str() {
                "jpeg_compressibility" => Box::new(JpegSize { compressible: true }),
                "jpeg_incompressibility" => Box::new(JpegSize { compressible: false }),
                "brightness" => Box::new(Brightness),
                "http" => Box::new(HttpReward::new(
                    needs(f, &f.url, HTTP_URL)?.clone(),
                    f.http.clone().unwrap_or_default(),
                )?),
                "shapes_geneval" => Box::new(ShapesGeneval { partial: f.partial }),
                "vlm_judge" => {
                    let vlm = needs(f, &f.vlm, CHAT)?.clone();
                    match vlm.backend {
                        JudgeBackend::Native => Box::new(NativeJudge::new(vlm, device)?),
                        JudgeBackend::Openai => Box::new(VlmJudge::new(
                            needs(f, &f.url, CHAT)?.clone(),
                            vlm,
                            f.http.clone().unwrap_or_default(),
                        )?),
                    }
                }
                "ocr" => Box::new(OcrReward::new(&f.ocr.clone().unwrap_or_default())?),
                "clip_score" | "pickscore" | "aesthetic" => {
                    let kind = match f.name.as_str() {
                        "clip_score" => ClipKind::ClipScore,
                        "pickscore" => ClipKind::PickScore,
                        _ => ClipKind::Aesthetic,
                    };
                    let settings = needs(f, &f.clip, CLIP)?;
                    Box::new(ClipReward::new(kind, settings, device)?)
                }
                "hpsv3" => Box::new(Hpsv3::new(needs(f, &f.hpsv3, HPSV3)?.clone(), device)?),
                // The sound is the sample's, not a frame's.
                "loudness" => {
                    return Ok((
                        Box::new(Loudness(f.loudness.clone().unwrap_or_default()))
                            as Box<dyn Reward>,
                        f.weight,
                    ))
                }
                other => unreachable!("validate() lists every reward name, not `{other}`"),
            };
            let scorer: Box<dyn Reward> = Box::new(PerFrame::new(scorer, f.frame_interval));
            Ok((scorer, f.weight))
        })
        .collect()
}
