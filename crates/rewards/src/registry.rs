//! The reward registry: scorer names → constructors.

use crate::{
    ClipKind, ClipReward, HttpReward, JpegSize, OcrReward, Reward, RewardConfig, RewardError,
    ShapesGeneval, VlmJudge, Weighted,
};

/// Every registered reward name.
pub const REWARD_NAMES: [&str; 9] = [
    "jpeg_compressibility",
    "jpeg_incompressibility",
    "http",
    "shapes_geneval",
    "vlm_judge",
    "ocr",
    "clip_score",
    "pickscore",
    "aesthetic",
];

/// The weighted scorers of a `reward` section; an unknown name lists the known ones.
pub fn build(config: &RewardConfig) -> Result<Vec<Weighted>, RewardError> {
    if config.functions.is_empty() {
        return Err(RewardError::Config(
            "reward.functions is empty; name at least one reward".into(),
        ));
    }
    config
        .functions
        .iter()
        .map(|f| {
            if !f.weight.is_finite() {
                return Err(RewardError::Config(format!(
                    "reward `{}`: weight {} is not finite",
                    f.name, f.weight
                )));
            }
            let scorer: Box<dyn Reward> = match f.name.as_str() {
                "jpeg_compressibility" => Box::new(JpegSize { compressible: true }),
                "jpeg_incompressibility" => Box::new(JpegSize { compressible: false }),
                "http" => {
                    let url = f.url.clone().ok_or_else(|| {
                        RewardError::Config(
                            "reward `http` needs `url: http://host:port/path`".into(),
                        )
                    })?;
                    Box::new(HttpReward::new(url, f.http.clone().unwrap_or_default())?)
                }
                "shapes_geneval" => Box::new(ShapesGeneval { partial: f.partial }),
                "vlm_judge" => {
                    let (Some(url), Some(vlm)) = (f.url.clone(), f.vlm.clone()) else {
                        return Err(RewardError::Config(
                            "reward `vlm_judge` needs `url: http://host:port/v1/chat/completions` and `vlm: {model: …}`".into(),
                        ));
                    };
                    Box::new(VlmJudge::new(url, vlm, f.http.clone().unwrap_or_default())?)
                }
                "ocr" => Box::new(OcrReward::new(&f.ocr.clone().unwrap_or_default())?),
                "clip_score" | "pickscore" | "aesthetic" => {
                    let kind = match f.name.as_str() {
                        "clip_score" => ClipKind::ClipScore,
                        "pickscore" => ClipKind::PickScore,
                        _ => ClipKind::Aesthetic,
                    };
                    let settings = f.clip.as_ref().ok_or_else(|| {
                        RewardError::Config(format!(
                            "reward `{}` needs `clip: {{model: <CLIPModel folder>}}`",
                            f.name
                        ))
                    })?;
                    Box::new(ClipReward::new(kind, settings)?)
                }
                other => {
                    return Err(RewardError::Config(format!(
                        "unknown reward `{other}`; known: {}",
                        REWARD_NAMES.join(", ")
                    )));
                }
            };
            // Each reward-specific setting, and the rewards it applies to.
            let specific: [(&str, bool, &[&str]); 4] = [
                ("partial", f.partial, &["shapes_geneval"]),
                ("vlm", f.vlm.is_some(), &["vlm_judge"]),
                ("ocr", f.ocr.is_some(), &["ocr"]),
                ("clip", f.clip.is_some(), &["clip_score", "pickscore", "aesthetic"]),
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
            Ok((scorer, f.weight))
        })
        .collect()
}
