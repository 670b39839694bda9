//! CLIP-family rewards on user-provided weights (a transformers `CLIPModel` folder):
//! - `clip_score`: 100 · max(cos(image, prompt), 0), as CLIPScore reports it;
//! - `pickscore`: PickScore's `exp(logit_scale) · cos(image, prompt)` divided by 26 (flow_grpo's
//!   normalisation; the raw value is the `pickscore/raw` extra);
//! - `aesthetic`: the LAION aesthetic head on the normalised image embedding (ViT-L/14).
//!
//! The model runs on `clip.device` (default: the training device, else the GPU when there is one)
//! in batches.

use std::path::PathBuf;

use flowtune_models::clip::{self, AestheticHead, ClipImageProcessor, ClipModel};
use flowtune_models::tokenizer::TextTokenizer;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::{Reward, RewardError, Sample, Score};

/// PickScore's published scores are divided by this to land near [0, 1] (flow_grpo).
pub const PICKSCORE_DIVISOR: f64 = 26.0;

/// `clip:` — the weights and where they run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClipSettings {
    /// A transformers `CLIPModel` folder: `config.json`, safetensors, `preprocessor_config.json`
    /// and tokenizer files.
    pub model: PathBuf,
    /// `aesthetic`: the LAION head as safetensors (`layers.{0,2,4,6,7}.{weight,bias}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<PathBuf>,
    /// A folder with `tokenizer.json` or `vocab.json` + `merges.txt`, or OpenAI's
    /// `bpe_simple_vocab_16e6.txt.gz`; default: the model folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<PathBuf>,
    /// `cpu`, `cuda` or `cuda:N`; default: the training device (this rank's GPU), else `cuda`
    /// when a GPU is present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Images per forward pass.
    #[serde(default = "batch_size")]
    pub batch_size: usize,
}

fn batch_size() -> usize {
    16
}

/// Which score a [`ClipReward`] gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClipKind {
    ClipScore,
    PickScore,
    Aesthetic,
}

impl ClipKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::ClipScore => "clip_score",
            Self::PickScore => "pickscore",
            Self::Aesthetic => "aesthetic",
        }
    }
}

/// A CLIP-family reward with its model loaded.
pub struct ClipReward {
    kind: ClipKind,
    model: ClipModel,
    processor: ClipImageProcessor,
    tokenizer: Option<TextTokenizer>,
    head: Option<AestheticHead>,
    device: Device,
    batch_size: usize,
}

// SAFETY: the model's tensors are only read (frozen, no autograd) and libtorch allows concurrent
// forward passes on shared read-only tensors.
unsafe impl Sync for ClipReward {}
unsafe impl Send for ClipReward {}

/// The device `name` (`cpu`, `cuda`, `cuda:N`) of the setting `key`; none: `default`.
pub(crate) fn device_named(
    name: Option<&str>,
    key: &str,
    default: Device,
) -> Result<Device, String> {
    match name {
        None => Ok(default),
        Some("cpu") => Ok(Device::Cpu),
        Some("cuda") => Ok(Device::Cuda(0)),
        Some(other) => other
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(Device::Cuda)
            .ok_or_else(|| format!("{key} `{other}`: expected cpu, cuda or cuda:N")),
    }
}

impl ClipReward {
    /// Loads the model on `clip.device`, else on `default` (the training device).
    pub fn new(
        kind: ClipKind,
        settings: &ClipSettings,
        default: Device,
    ) -> Result<Self, RewardError> {
        let fail = |message: String| RewardError::Failed { reward: kind.name().into(), message };
        let device = device_named(settings.device.as_deref(), "clip.device", default)
            .map_err(RewardError::Config)?;
        let model = ClipModel::load(&settings.model, device, Kind::Float)
            .map_err(|e| fail(e.to_string()))?;
        let processor =
            ClipImageProcessor::load(&settings.model).map_err(|e| fail(e.to_string()))?;
        let tokenizer = match kind {
            ClipKind::Aesthetic => None,
            _ => {
                let source = settings.tokenizer.as_ref().unwrap_or(&settings.model);
                let tok = if source.is_file() {
                    clip::tokenizer::from_merges_file(source)
                } else {
                    clip::tokenizer::load(source)
                };
                Some(tok.map_err(|e| fail(e.to_string()))?)
            }
        };
        let head = match (kind, &settings.head) {
            (ClipKind::Aesthetic, Some(path)) => {
                let head = AestheticHead::load(path, device).map_err(|e| fail(e.to_string()))?;
                if head.input_width() != model.config.projection_dim {
                    return Err(fail(format!(
                        "{} takes {}-wide embeddings but {} projects to {}",
                        path.display(),
                        head.input_width(),
                        settings.model.display(),
                        model.config.projection_dim
                    )));
                }
                Some(head)
            }
            (ClipKind::Aesthetic, None) => {
                return Err(RewardError::Config(
                    "reward `aesthetic` needs `clip: {model: …, head: …}`".into(),
                ))
            }
            (_, Some(_)) => {
                return Err(RewardError::Config(format!(
                    "reward `{}`: `clip.head` applies only to aesthetic",
                    kind.name()
                )))
            }
            (_, None) => None,
        };
        Ok(Self {
            kind,
            model,
            processor,
            tokenizer,
            head,
            device,
            batch_size: settings.batch_size.max(1),
        })
    }

    /// Projected image and (except for `aesthetic`) prompt embeddings of a batch.
    fn embeddings(&self, samples: &[Sample<'_>]) -> Result<(Tensor, Option<Tensor>), String> {
        let images: Vec<(usize, usize, &[u8])> = samples
            .iter()
            .map(|s| {
                (s.image.height() as usize, s.image.width() as usize, s.image.as_raw().as_slice())
            })
            .collect();
        let pixels =
            self.processor.pixel_values(&images, self.device).map_err(|e| e.to_string())?;
        let image = self.model.image_embeds(&pixels).map_err(|e| e.to_string())?;
        let text = match &self.tokenizer {
            Some(tok) => {
                let prompts: Vec<&str> = samples.iter().map(|s| s.prompt).collect();
                let length = self.model.config.text_config.max_position_embeddings as usize;
                let ids =
                    tok.encode(&prompts, length).map_err(|e| e.to_string())?.to_device(self.device);
                Some(self.model.text_embeds(&ids).map_err(|e| e.to_string())?)
            }
            None => None,
        };
        Ok((image, text))
    }

    fn score_batch(&self, samples: &[Sample<'_>]) -> Result<Vec<Score>, String> {
        let _guard = tch::no_grad_guard();
        let (image, text) = self.embeddings(samples)?;
        let values = match (self.kind, text, &self.head) {
            (ClipKind::ClipScore, Some(text), _) => clip_score(&image, &text),
            (ClipKind::PickScore, Some(text), _) => {
                pickscore(&image, &text, self.model.logit_scale())
            }
            (ClipKind::Aesthetic, _, Some(head)) => to_vec(&head.forward(&image)),
            _ => unreachable!("new() pairs each kind with what it needs"),
        };
        Ok(values
            .into_iter()
            .map(|v| match self.kind {
                ClipKind::PickScore => Score {
                    value: v / PICKSCORE_DIVISOR,
                    extras: [("pickscore/raw".to_string(), v)].into_iter().collect(),
                },
                _ => Score { value: v, extras: Default::default() },
            })
            .collect())
    }
}

fn to_vec(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double).to_device(Device::Cpu).flatten(0, -1))
        .unwrap_or_default()
}

/// Row-wise cosine similarity of two (B, D) embeddings.
pub fn cosine(image: &Tensor, text: &Tensor) -> Tensor {
    let unit = |t: &Tensor| {
        let t = t.to_kind(Kind::Float);
        &t / t.norm_scalaropt_dim(2, [-1], true)
    };
    (unit(image) * unit(text)).sum_dim_intlist(Some([-1i64].as_slice()), false, Kind::Float)
}

/// CLIPScore: `100 · max(cos, 0)` per row.
pub fn clip_score(image: &Tensor, text: &Tensor) -> Vec<f64> {
    to_vec(&(cosine(image, text).clamp_min(0.0) * 100.0))
}

/// PickScore before normalisation: `exp(logit_scale) · cos` per row (`scale` = exp(logit_scale)).
pub fn pickscore(image: &Tensor, text: &Tensor, scale: f64) -> Vec<f64> {
    to_vec(&(cosine(image, text) * scale))
}

impl Reward for ClipReward {
    fn name(&self) -> &str {
        self.kind.name()
    }

    fn score(&self, samples: &[Sample<'_>]) -> Result<Vec<Score>, RewardError> {
        let mut out = Vec::with_capacity(samples.len());
        for chunk in samples.chunks(self.batch_size) {
            let scores = self.score_batch(chunk).map_err(|message| RewardError::Failed {
                reward: self.kind.name().into(),
                message,
            })?;
            out.extend(scores);
        }
        Ok(out)
    }
}
