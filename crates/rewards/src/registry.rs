//! The reward registry: scorer names → constructors.

use crate::{
    ClipKind, ClipReward, HttpReward, JpegSize, OcrReward, Reward, RewardConfig, RewardError,
    ShapesGeneval, VlmJudge, Weighted,
};

/// Every registered reward name.
pub const REWARD_NAMES: [&str; 6] = [
    "jpeg_compressibility",
    "jpeg_incompressibility",
    "http",
    "shapes_geneval",
    "vlm_judge",
    "ocr",
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
            if f.partial && f.name != "shapes_geneval" {
                return Err(RewardError::Config(format!(
                    "reward `{}`: `partial` applies only to shapes_geneval",
                    f.name
                )));
            }
            if f.vlm.is_some() && f.name != "vlm_judge" {
                return Err(RewardError::Config(format!(
                    "reward `{}`: `vlm` applies only to vlm_judge",
                    f.name
                )));
            }
            if f.clip.is_some() && !["clip_score", "pickscore", "aesthetic"].contains(&f.name.as_str()) {
                return Err(RewardError::Config(format!(
                    "reward `{}`: `clip` applies only to clip_score, pickscore and aesthetic",
                    f.name
                )));
            }
            if f.ocr.is_some() && f.name != "ocr" {
                return Err(RewardError::Config(format!(
                    "reward `{}`: `ocr` applies only to ocr",
                    f.name
                )));
            }
            Ok((scorer, f.weight))
        })
        .collect()
}
