//! A rollout rank's share of a step as it travels to the training ranks: its scored samples as
//! named tensors and a message with the rest (scores, windows, image sizes, timings), and the
//! training ranks' view of them: their own rows of each share, stacked.

use std::collections::BTreeMap;
use std::ops::Range;

use flowtune_models::{TextConditioning, Waveform};
use flowtune_rewards::{RgbImage, ScoredBatch};
use flowtune_rollout::{RolloutBatch, Trajectory};
use serde::{Deserialize, Serialize};
use tch::{Device, Tensor};

use crate::TrainError;

/// What travels beside a share's tensors.
#[derive(Serialize, Deserialize)]
pub(crate) struct Part {
    /// The training step the samples are for.
    pub step: u64,
    /// The rows' prompt groups, which the training ranks check against their own loader's.
    pub uids: Vec<String>,
    pub scores: ScoredBatch,
    pub windows: Vec<Range<usize>>,
    /// Token counts of the prompt rows and of the negative rows, where known.
    pub lengths: Option<Vec<i64>>,
    pub negative_lengths: Option<Vec<i64>>,
    /// Each image's width and height; the pixels travel as one byte tensor.
    pub image_sizes: Vec<(u32, u32)>,
    /// The sample rate of the rows' sounds (one (B, channels, samples) tensor), for a family
    /// with an audio stream.
    pub audio_rate: Option<u32>,
    /// Seconds sampling and scoring took, and the rollout's floating-point operations.
    pub gen_s: f64,
    pub reward_s: f64,
    pub flops: f64,
}

/// The tensors of `batch` by name.
pub(crate) fn tensors(batch: &RolloutBatch) -> BTreeMap<String, Tensor> {
    let mut all = BTreeMap::new();
    text_tensors("text", &batch.text, &mut all);
    if let Some(negative) = &batch.negative {
        text_tensors("negative", negative, &mut all);
    }
    let t = &batch.trajectory;
    for (name, tensor) in [
        ("all_latents", &t.all_latents),
        ("all_log_probs", &t.all_log_probs),
        ("all_timesteps", &t.all_timesteps),
        ("final_latents", &t.final_latents),
    ] {
        all.insert(format!("trajectory.{name}"), tensor.shallow_clone());
    }
    let pixels: Vec<u8> = batch.images.iter().flat_map(|i| i.as_raw().iter().copied()).collect();
    all.insert("images".into(), Tensor::from_slice(&pixels));
    if !batch.audio.is_empty() {
        let rows: Vec<Tensor> = batch
            .audio
            .iter()
            .map(|w| {
                Tensor::stack(
                    &w.channels.iter().map(|c| Tensor::from_slice(c)).collect::<Vec<_>>(),
                    0,
                )
            })
            .collect();
        all.insert("audio".into(), Tensor::stack(&rows, 0));
    }
    all
}

/// The sample rate of `audio`'s rows, if there are any.
pub(crate) fn audio_rate(audio: &[Waveform]) -> Option<u32> {
    audio.first().map(|w| w.sample_rate)
}

fn text_tensors(prefix: &str, text: &TextConditioning, out: &mut BTreeMap<String, Tensor>) {
    out.insert(format!("{prefix}.embeds"), text.embeds.shallow_clone());
    if let Some(pooled) = &text.pooled {
        out.insert(format!("{prefix}.pooled"), pooled.shallow_clone());
    }
    if let Some(mask) = &text.mask {
        out.insert(format!("{prefix}.mask"), mask.shallow_clone());
    }
    for (name, t) in &text.extras {
        out.insert(format!("{prefix}.extra.{name}"), t.shallow_clone());
    }
}

/// The batch `part` and `tensors` describe, on `device`.
pub(crate) fn batch(
    part: &Part,
    mut tensors: BTreeMap<String, Tensor>,
    device: Device,
) -> Result<RolloutBatch, TrainError> {
    let mut take = |name: &str| {
        tensors
            .remove(name)
            .map(|t| t.to_device(device))
            .ok_or_else(|| TrainError::Distributed(format!("a rollout rank's samples lack {name}")))
    };
    let trajectory = Trajectory {
        all_latents: take("trajectory.all_latents")?,
        all_log_probs: take("trajectory.all_log_probs")?,
        all_timesteps: take("trajectory.all_timesteps")?,
        final_latents: take("trajectory.final_latents")?,
    };
    let pixels = Vec::<u8>::try_from(&take("images")?.to_device(Device::Cpu))?;
    let mut images = vec![];
    let mut at = 0;
    for &(w, h) in &part.image_sizes {
        let len = (w * h * 3) as usize;
        let image = pixels.get(at..at + len).and_then(|p| RgbImage::from_raw(w, h, p.to_vec()));
        images.push(image.ok_or_else(|| {
            TrainError::Distributed(format!("a handed-over {w}×{h} image is cut short"))
        })?);
        at += len;
    }
    let audio = match part.audio_rate {
        Some(rate) => Waveform::from_batch(&take("audio")?, rate)?,
        None => vec![],
    };
    let prompts = conditioning(&mut tensors, "text", part.lengths.clone(), device)?
        .ok_or_else(|| TrainError::Distributed("a rollout rank's samples lack text".into()))?;
    let negative = conditioning(&mut tensors, "negative", part.negative_lengths.clone(), device)?;
    Ok(RolloutBatch {
        text: prompts,
        negative,
        windows: part.windows.clone(),
        trajectory,
        images,
        audio,
    })
}

/// The conditioning under `prefix`, if sent.
fn conditioning(
    tensors: &mut BTreeMap<String, Tensor>,
    prefix: &str,
    lengths: Option<Vec<i64>>,
    device: Device,
) -> Result<Option<TextConditioning>, TrainError> {
    let Some(embeds) = tensors.remove(&format!("{prefix}.embeds")) else { return Ok(None) };
    let mut take = |name: &str| tensors.remove(&format!("{prefix}.{name}"));
    let mut text = TextConditioning::new(embeds, take("pooled"));
    text.mask = take("mask");
    let extra = format!("{prefix}.extra.");
    let names: Vec<String> = tensors.keys().filter(|k| k.starts_with(&extra)).cloned().collect();
    for name in names {
        let t = tensors.remove(&name).expect("listed");
        text.extras.insert(name[extra.len()..].to_string(), t);
    }
    let mut text = text.map_rows(|t| t.to_device(device));
    text.lengths = lengths;
    Ok(Some(text))
}

/// Batches of consecutive rows stacked in order.
pub(crate) fn stack(parts: Vec<RolloutBatch>) -> Result<RolloutBatch, TrainError> {
    if parts.len() == 1 {
        return Ok(parts.into_iter().next().expect("one part"));
    }
    let cat =
        |f: fn(&RolloutBatch) -> &Tensor| Tensor::cat(&parts.iter().map(f).collect::<Vec<_>>(), 0);
    let trajectory = Trajectory {
        all_latents: cat(|b| &b.trajectory.all_latents),
        all_log_probs: cat(|b| &b.trajectory.all_log_probs),
        all_timesteps: cat(|b| &b.trajectory.all_timesteps),
        final_latents: cat(|b| &b.trajectory.final_latents),
    };
    let text = TextConditioning::stack(
        parts.iter().map(|b| b.text.map_rows(Tensor::shallow_clone)).collect(),
    )?;
    let negatives: Option<Vec<TextConditioning>> = parts
        .iter()
        .map(|b| b.negative.as_ref().map(|n| n.map_rows(Tensor::shallow_clone)))
        .collect();
    let negative = negatives.map(TextConditioning::stack).transpose()?;
    let windows = parts.iter().flat_map(|b| b.windows.clone()).collect();
    let audio = parts.iter().flat_map(|b| b.audio.clone()).collect();
    let images = parts.into_iter().flat_map(|b| b.images).collect();
    Ok(RolloutBatch { text, negative, windows, trajectory, images, audio })
}

/// Rows `rows` of `batch`, in storage of their own.
pub(crate) fn rows(batch: &RolloutBatch, rows: &Range<usize>) -> RolloutBatch {
    let (start, len) = (rows.start as i64, rows.len() as i64);
    let t = &batch.trajectory;
    let cut = |x: &Tensor| x.narrow(0, start, len).copy();
    let text = |c: &TextConditioning| c.narrow(start, len).map_rows(Tensor::copy);
    RolloutBatch {
        text: text(&batch.text),
        negative: batch.negative.as_ref().map(text),
        windows: batch.windows[rows.clone()].to_vec(),
        trajectory: Trajectory {
            all_latents: cut(&t.all_latents),
            all_log_probs: cut(&t.all_log_probs),
            all_timesteps: cut(&t.all_timesteps),
            final_latents: cut(&t.final_latents),
        },
        images: batch.images[rows.clone()].to_vec(),
        audio: batch.audio.get(rows.clone()).map_or(vec![], <[Waveform]>::to_vec),
    }
}

/// Image sizes of `images`.
pub(crate) fn sizes(images: &[RgbImage]) -> Vec<(u32, u32)> {
    images.iter().map(|i| (i.width(), i.height())).collect()
}
