//! The `ocr` reward: PP-OCRv6 detection and recognition (the ONNX models the PyPI `rapidocr`
//! wheel ships) run in-process through ONNX Runtime, reading the picture the way `rapidocr` does
//! without its angle classifier; the text read is scored against the ground truth with the
//! reference rule ([`crate::ocr_score`]).

mod detect;
mod geometry;
mod picture;
mod recognize;
mod runtime;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{ocr_score::score_read_text, Reward, RewardError, RgbImage, Sample, Score};
use detect::{DetectSettings, TextBox};
use picture::Picture;
use runtime::Model;

/// The detection model's file name.
pub const DETECTION_MODEL: &str = "PP-OCRv6_det_small.onnx";
/// The recognition model's file name (its character table is in its metadata).
pub const RECOGNITION_MODEL: &str = "PP-OCRv6_rec_small.onnx";
/// The ONNX Runtime library `scripts/setup-rewards.sh` installs beside the models.
pub const RUNTIME_LIBRARY: &str = "libonnxruntime.so.1.32.0";

/// `ocr:` — where the models and runtime are, and how the reader runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct OcrSettings {
    /// The folder holding the two models; default `$FLOWTUNE_OCR_DIR`, else
    /// `$FLOWTUNE_CACHE/ocr`, else `~/.cache/flowtune/ocr` (where `scripts/setup-rewards.sh` puts them).
    pub models: Option<PathBuf>,
    /// `libonnxruntime.so`; default `$ORT_DYLIB_PATH`, else the one in the models folder.
    pub runtime: Option<PathBuf>,
    /// ONNX Runtime threads per model run (kept small so rollout keeps its cores).
    pub threads: usize,
    /// Lines read with a lower mean confidence are dropped.
    pub text_score: f64,
    /// `cpu`, or `cuda` / `cuda:N` through ONNX Runtime's CUDA execution provider (needs the
    /// library of the `onnxruntime-gpu` wheel as `runtime`).
    pub device: String,
}

impl Default for OcrSettings {
    fn default() -> Self {
        Self { models: None, runtime: None, threads: 2, text_score: 0.5, device: "cpu".into() }
    }
}

impl OcrSettings {
    /// The models folder after defaults.
    pub fn models_dir(&self) -> PathBuf {
        let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        self.models.clone().or_else(|| env("FLOWTUNE_OCR_DIR")).unwrap_or_else(|| {
            env("FLOWTUNE_CACHE")
                .or_else(|| env("HOME").map(|h| h.join(".cache/flowtune")))
                .unwrap_or_else(|| PathBuf::from(".cache/flowtune"))
                .join("ocr")
        })
    }

    /// The GPU the models run on, if any.
    pub fn cuda_device(&self) -> Result<Option<i32>, String> {
        match self.device.as_str() {
            "cpu" => Ok(None),
            "cuda" => Ok(Some(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Some)
                .ok_or_else(|| format!("ocr.device `{other}`: expected cpu, cuda or cuda:N")),
        }
    }

    /// The runtime library after defaults.
    pub fn runtime_library(&self) -> PathBuf {
        self.runtime
            .clone()
            .or_else(|| {
                std::env::var_os("ORT_DYLIB_PATH").filter(|v| !v.is_empty()).map(PathBuf::from)
            })
            .unwrap_or_else(|| self.models_dir().join(RUNTIME_LIBRARY))
    }
}

/// One line of text read: the text and the recogniser's mean confidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub text: String,
    pub confidence: f64,
}

/// A text reader: detection, crops, recognition.
pub struct Reader {
    detector: Model,
    recogniser: Model,
    charset: Vec<String>,
    detect: DetectSettings,
    text_score: f64,
}

impl Reader {
    /// Loads both models (and the runtime, once per process).
    pub fn new(settings: &OcrSettings) -> Result<Self, String> {
        let (dir, library) = (settings.models_dir(), settings.runtime_library());
        let cuda = settings.cuda_device()?;
        let detector = Model::load(&library, &dir.join(DETECTION_MODEL), settings.threads, cuda)?;
        let recogniser =
            Model::load(&library, &dir.join(RECOGNITION_MODEL), settings.threads, cuda)?;
        let table = recogniser.metadata("character")?.ok_or_else(|| {
            format!(
                "{}: no `character` table in its metadata",
                dir.join(RECOGNITION_MODEL).display()
            )
        })?;
        Ok(Self {
            detector,
            recogniser,
            charset: recognize::charset(&table),
            detect: DetectSettings::default(),
            text_score: settings.text_score,
        })
    }

    /// The lines of text in `image`, in reading order.
    pub fn read(&self, image: &RgbImage) -> Result<Vec<Line>, String> {
        let picture = within_bounds(Picture::from_rgb(image));
        let picture = letterboxed(picture);
        let boxes = self.detect(&picture)?;
        let crops: Vec<Picture> = boxes.iter().map(|b| crop(&picture, b)).collect();
        let mut lines = vec![Line { text: String::new(), confidence: 0.0 }; crops.len()];
        for (members, width) in recognize::batches(&crops) {
            let data: Vec<f32> =
                members.iter().flat_map(|&i| recognize::input(&crops[i], width)).collect();
            let (shape, probabilities) =
                self.recogniser.run(&[members.len(), 3, recognize::HEIGHT, width], data)?;
            let [n, steps, classes] = shape[..] else {
                return Err(format!(
                    "the recogniser returned shape {shape:?}, expected [batch, steps, classes]"
                ));
            };
            if n != members.len() || classes != self.charset.len() {
                return Err(format!(
                    "the recogniser returned {n} lines of {classes} classes for {} crops and a table of {}",
                    members.len(),
                    self.charset.len()
                ));
            }
            for (row, &i) in probabilities.chunks_exact(steps * classes).zip(&members) {
                let (text, confidence) = recognize::decode(row, classes, &self.charset);
                lines[i] = Line { text, confidence };
            }
        }
        lines.retain(|l| !l.text.trim().is_empty() && l.confidence >= self.text_score);
        Ok(lines)
    }

    fn detect(&self, picture: &Picture) -> Result<Vec<TextBox>, String> {
        let Some((shape, data)) = detect::input(picture, self.detect.min_side) else {
            return Ok(vec![]);
        };
        let (out, probability) = self.detector.run(&shape, data)?;
        let [_, _, h, w] = out[..] else {
            return Err(format!("the detector returned shape {out:?}, expected [1, 1, H, W]"));
        };
        Ok(detect::boxes(&probability, w, h, picture.width, picture.height, &self.detect))
    }
}

/// Pictures outside 30–2000 px a side are scaled (to multiples of 32) as the reference does.
fn within_bounds(picture: Picture) -> Picture {
    let scaled = |p: Picture, ratio: f64| {
        let (w, h) = detect::scaled_to_32(p.width, p.height, ratio);
        p.resize(w.max(32), h.max(32))
    };
    let long = picture.width.max(picture.height);
    let picture = if long > 2000 { scaled(picture, 2000.0 / long as f64) } else { picture };
    let short = picture.width.min(picture.height);
    if short < 30 {
        scaled(picture, 30.0 / short as f64)
    } else {
        picture
    }
}

/// A very wide or low picture gets black bands above and below, as the reference adds.
fn letterboxed(picture: Picture) -> Picture {
    let (w, h) = (picture.width as f64, picture.height as f64);
    if h <= 30.0 || w / h > 8.0 {
        let target = ((w / 8.0).trunc().max(30.0)) * 2.0;
        return picture.pad_vertically(((target - h).abs() / 2.0) as usize);
    }
    picture
}

/// The box cut out upright; a crop 1.5 times taller than wide is turned to read sideways text.
fn crop(picture: &Picture, b: &TextBox) -> Picture {
    let d = |p: [f64; 2], q: [f64; 2]| (p[0] - q[0]).hypot(p[1] - q[1]);
    let width = d(b[0], b[1]).max(d(b[2], b[3])) as usize;
    let height = d(b[0], b[3]).max(d(b[1], b[2])) as usize;
    let out = picture.warp_quad(b, width.max(1), height.max(1));
    if out.height as f64 / out.width as f64 >= 1.5 {
        out.rotate_counter_clockwise()
    } else {
        out
    }
}

/// The `ocr` reward: the text read, joined in reading order, scored against the ground truth.
/// Extras: `ocr/exact` (1 when the score is 1) and `ocr/lines` (lines read).
pub struct OcrReward {
    reader: Reader,
}

impl OcrReward {
    pub fn new(settings: &OcrSettings) -> Result<Self, RewardError> {
        Ok(Self {
            reader: Reader::new(settings)
                .map_err(|message| RewardError::Failed { reward: "ocr".into(), message })?,
        })
    }
}

impl Reward for OcrReward {
    fn name(&self) -> &str {
        "ocr"
    }

    fn score(&self, samples: &[Sample<'_>]) -> Result<Vec<Score>, RewardError> {
        let fail = |message: String| RewardError::Failed { reward: "ocr".into(), message };
        samples
            .iter()
            .enumerate()
            .map(|(i, sample)| {
                let lines =
                    self.reader.read(sample.image).map_err(|e| fail(format!("sample {i}: {e}")))?;
                let text: String = lines.iter().map(|l| l.text.as_str()).collect();
                let value = score_read_text(i, sample, &text, fail)?;
                let extras = [
                    ("ocr/exact".to_string(), f64::from(value == 1.0)),
                    ("ocr/lines".to_string(), lines.len() as f64),
                ];
                Ok(Score { value, extras: extras.into_iter().collect() })
            })
            .collect()
    }
}
