//! What a denoiser is conditioned on besides latents and time: the encoded prompt, with whatever
//! a family adds (a pooled vector, an attention mask, per-row extras such as a guidance value or
//! image shapes). Every tensor has the batch as its first dimension, so selecting, slicing and
//! stacking rows works the same for every family.

use std::collections::{BTreeMap, HashMap};

use flowtune_sampling::upload;
use tch::Tensor;

use crate::ModelError;

/// The extra naming latents held fixed at the start of every sample: the conditioned first frame
/// of image-to-video, (B, C, Fh, H, W) of a clip (Wan2.2-TI2V) or the first frame's (B, Sh, C)
/// leading tokens of a packed latent (LTX-2). Rollouts keep those frames at these
/// values in every step, the denoiser sees them at timestep 0 and predicts no velocity for them,
/// and log-probs average over the other (generated) frames only.
pub const HELD_LATENTS: &str = "held_latents";

/// What a denoiser that masks padded text tokens can run instead, for the same velocities: its
/// key mask dropped when every row's tokens fill the text (`FullRows`), or also its rows grouped
/// by token count, each group trimmed to its length and run without a mask (`Regroup`; for
/// families whose other conditioning does not depend on the text's length). Attention without a
/// mask can take SDPA's fastest kernels (flash, cuDNN), which refuse arbitrary masks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unpadding {
    Keep,
    FullRows,
    Regroup,
}

/// Text conditioning of a denoiser, one row per sample.
pub struct TextConditioning {
    /// (B, L, D) token states.
    pub embeds: Tensor,
    /// (B, P) pooled text, where the model takes one (SD3, Flux).
    pub pooled: Option<Tensor>,
    /// (B, L) 1 for tokens, 0 for padding, where the model masks attention (Qwen-Image, Wan).
    pub mask: Option<Tensor>,
    /// Each row's token count on the host, where `mask` is each row's first tokens (padding at
    /// the end): what lets the denoiser run rows without padding ([`crate::unpadded_velocity`])
    /// without reading the device. `None` when unknown.
    pub lengths: Option<Vec<i64>>,
    /// Per-row extras a family's denoiser reads by name, each (B, …): e.g. `guidance` (B,) for
    /// Flux [dev], `img_shapes` (B, 3) for Qwen-Image.
    pub extras: BTreeMap<String, Tensor>,
}

impl TextConditioning {
    /// Token states and an optional pooled vector; no mask, no extras.
    pub fn new(embeds: Tensor, pooled: Option<Tensor>) -> Self {
        Self { embeds, pooled, mask: None, lengths: None, extras: BTreeMap::new() }
    }

    /// The conditioning in diffusers' argument names: `encoder_hidden_states`, optional
    /// `pooled_projections` and `encoder_hidden_states_mask`, and every other tensor besides
    /// `hidden_states` and `timestep` as a named extra (e.g. `guidance`).
    pub fn from_named(inputs: &HashMap<String, Tensor>) -> Result<Self, ModelError> {
        const OWN: [&str; 5] = [
            "hidden_states",
            "timestep",
            "encoder_hidden_states",
            "pooled_projections",
            "encoder_hidden_states_mask",
        ];
        let embeds = inputs
            .get("encoder_hidden_states")
            .ok_or_else(|| ModelError::Input("no input `encoder_hidden_states`".into()))?;
        let mut text = Self::new(
            embeds.shallow_clone(),
            inputs.get("pooled_projections").map(Tensor::shallow_clone),
        );
        text.mask = inputs.get("encoder_hidden_states_mask").map(Tensor::shallow_clone);
        for (name, t) in inputs.iter().filter(|(n, _)| !OWN.contains(&n.as_str())) {
            text.extras.insert(name.clone(), t.shallow_clone());
        }
        Ok(text)
    }

    /// The same conditioning with `f` applied to every per-row tensor; `f` keeps the rows (a
    /// move to another device, say), or the caller sets [`Self::lengths`] after.
    pub fn map_rows(&self, f: impl Fn(&Tensor) -> Tensor) -> Self {
        Self {
            embeds: f(&self.embeds),
            pooled: self.pooled.as_ref().map(&f),
            mask: self.mask.as_ref().map(&f),
            lengths: self.lengths.clone(),
            extras: self.extras.iter().map(|(k, t)| (k.clone(), f(t))).collect(),
        }
    }

    /// Rows `[self; other]` stacked, for one batched CFG forward. Both sides carry the same
    /// fields with the same token length.
    pub fn concat(&self, other: &Self) -> Self {
        let cat = |a: &Tensor, b: &Tensor| Tensor::cat(&[a, b], 0);
        let both = |a: &Option<Tensor>, b: &Option<Tensor>| {
            a.as_ref().zip(b.as_ref()).map(|(a, b)| cat(a, b))
        };
        Self {
            embeds: cat(&self.embeds, &other.embeds),
            pooled: both(&self.pooled, &other.pooled),
            mask: both(&self.mask, &other.mask),
            lengths: self
                .lengths
                .as_ref()
                .zip(other.lengths.as_ref())
                .map(|(a, b)| [&a[..], b].concat()),
            extras: self
                .extras
                .iter()
                .filter_map(|(k, a)| other.extras.get(k).map(|b| (k.clone(), cat(a, b))))
                .collect(),
        }
    }

    /// The rows of `parts` stacked in order; token lengths may differ (shorter rows are padded
    /// with zeros and masked), extras must have the same shape past the batch. The rows' token
    /// counts are read to the host here, once per batch ([`Self::lengths`]).
    pub fn stack(parts: Vec<Self>) -> Result<Self, ModelError> {
        if parts.len() == 1 {
            return Ok(parts.into_iter().next().expect("one part").with_lengths());
        }
        let parts: Vec<Self> = parts.into_iter().map(Self::with_lengths).collect();
        let longest = parts.iter().map(|p| p.embeds.size()[1]).max().unwrap_or(0);
        // Parts of one length without masks (fixed-length encoders) stay without one.
        let unmasked = parts.iter().all(|p| p.mask.is_none() && p.embeds.size()[1] == longest);
        // Zeros after the last token: (B, L) → [0, extra]; (B, L, D) → [0, 0, 0, extra].
        let pad = |t: &Tensor, len: i64| {
            let mut pads = vec![0i64; 2 * (t.dim() - 2)];
            pads.extend([0, longest - len]);
            t.constant_pad_nd(pads)
        };
        let mut padded = vec![];
        for part in parts {
            let (b, len) = (part.embeds.size()[0], part.embeds.size()[1]);
            let mask = part.mask.as_ref().map(Tensor::shallow_clone).unwrap_or_else(|| {
                Tensor::ones([b, len], (tch::Kind::Int64, part.embeds.device()))
            });
            let embeds = pad(&part.embeds, len);
            // A row without a mask is all tokens; a mask that is not a prefix leaves it unknown.
            let lengths = match &part.mask {
                None => Some(vec![len; b as usize]),
                Some(_) => part.lengths,
            };
            padded.push(Self {
                embeds,
                mask: Some(pad(&mask, len)),
                lengths,
                pooled: part.pooled,
                extras: part.extras,
            });
        }
        let first = &padded[0];
        for part in &padded[1..] {
            let same = first.extras.len() == part.extras.len()
                && first.extras.iter().all(|(k, t)| {
                    part.extras.get(k).is_some_and(|u| u.size()[1..] == t.size()[1..])
                });
            if !same || first.pooled.is_some() != part.pooled.is_some() {
                return Err(ModelError::Input(format!(
                    "rows of one batch are conditioned differently: {:?} vs {:?} (e.g. condition \
                     pictures of different sizes; give one batch pictures of one size)",
                    shapes(first),
                    shapes(part)
                )));
            }
        }
        let cat =
            |f: &dyn Fn(&Self) -> Tensor| Tensor::cat(&padded.iter().map(f).collect::<Vec<_>>(), 0);
        Ok(Self {
            embeds: cat(&|p| p.embeds.shallow_clone()),
            pooled: first
                .pooled
                .as_ref()
                .map(|_| cat(&|p| p.pooled.as_ref().unwrap().shallow_clone())),
            mask: (!unmasked).then(|| cat(&|p| p.mask.as_ref().unwrap().shallow_clone())),
            lengths: (!unmasked)
                .then(|| padded.iter().map(|p| p.lengths.clone()).collect::<Option<Vec<_>>>())
                .flatten()
                .map(|lengths| lengths.concat()),
            extras: first
                .extras
                .keys()
                .map(|k| (k.clone(), cat(&|p| p.extras[k].shallow_clone())))
                .collect(),
        })
    }

    /// These rows with `held` (one row: (1, C, Fh, H, W) or (1, Sh, C)) as every row's
    /// [`HELD_LATENTS`].
    pub fn holding(mut self, held: &Tensor) -> Self {
        let mut rows = vec![1; held.dim()];
        rows[0] = self.embeds.size()[0];
        self.extras.insert(HELD_LATENTS.into(), held.repeat(rows.as_slice()));
        self
    }

    /// The latents held fixed at the start of every sample ([`HELD_LATENTS`]), if any.
    pub fn held_latents(&self) -> Option<&Tensor> {
        self.extras.get(HELD_LATENTS)
    }

    /// The rows at `index` (a 1-D int64 tensor), without their token counts (which
    /// [`Self::rows_at`] keeps, reading nothing back from the device).
    pub fn rows(&self, index: &Tensor) -> Self {
        let mut rows = self.map_rows(|t| t.index_select(0, index));
        rows.lengths = None;
        rows
    }

    /// The rows at host indices `index`.
    pub fn rows_at(&self, index: &[i64]) -> Self {
        let device = upload(Tensor::from_slice(index), self.embeds.device());
        let mut rows = self.map_rows(|t| t.index_select(0, &device));
        rows.lengths =
            self.lengths.as_ref().map(|l| index.iter().map(|&i| l[i as usize]).collect());
        rows
    }

    /// Rows `start .. start + len`.
    pub fn narrow(&self, start: i64, len: i64) -> Self {
        let mut rows = self.map_rows(|t| t.narrow(0, start, len));
        rows.lengths =
            self.lengths.as_ref().map(|l| l[start as usize..(start + len) as usize].to_vec());
        rows
    }

    /// Every row's first `len` tokens, without a mask: for rows whose tokens all lie there.
    pub fn trimmed(&self, len: i64) -> Self {
        let mut text = self.map_rows(Tensor::shallow_clone);
        text.embeds = self.embeds.narrow(1, 0, len);
        text.mask = None;
        text.lengths = None;
        text
    }

    /// [`Self::lengths`] read from the mask (a host read) when unknown and the mask is each row's
    /// first tokens.
    fn with_lengths(mut self) -> Self {
        if self.lengths.is_none() {
            self.lengths = self.mask.as_ref().and_then(prefix_lengths);
        }
        self
    }
}

/// Each row's token count when the mask (B, L) marks each row's first tokens only.
fn prefix_lengths(mask: &Tensor) -> Option<Vec<i64>> {
    let tokens = mask.ne(0).to_device(tch::Device::Cpu);
    let counts = tokens.sum_dim_intlist(1, false, tch::Kind::Int64);
    let positions = Tensor::arange(tokens.size()[1], (tch::Kind::Int64, tch::Device::Cpu));
    let prefix = positions.unsqueeze(0).lt_tensor(&counts.unsqueeze(1));
    prefix.equal(&tokens).then(|| Vec::<i64>::try_from(&counts).ok()).flatten()
}

/// The axis held latents lead along: frames of a clip (B, C, F, H, W), tokens of a packed latent
/// (B, S, C) whose first tokens are the first frame's (LTX-2).
fn held_axis(latents: &Tensor) -> i64 {
    if latents.dim() == 3 {
        1
    } else {
        2
    }
}

/// `latents` with their leading frames (or tokens, for a packed (B, S, C) latent) replaced by
/// `held` (B, C, Fh, H, W) or (B, Sh, C), in the latents' dtype.
pub fn hold_frames(latents: &Tensor, held: &Tensor) -> Tensor {
    let axis = held_axis(latents);
    let fh = held.size()[axis as usize];
    let rest = latents.narrow(axis, fh, latents.size()[axis as usize] - fh);
    Tensor::cat(&[held.to_kind(latents.kind()), rest], axis)
}

/// A mask of `latents`' frames, (1, 1, F, 1, 1) for a clip or (1, S, 1) for packed tokens: 0 on
/// the `held` ones, 1 on the generated ones.
pub fn generated_frames(latents: &Tensor, held: &Tensor) -> Tensor {
    let axis = held_axis(latents);
    let (len, fh) = (latents.size()[axis as usize], held.size()[axis as usize]);
    let mut shape = vec![1; latents.dim()];
    shape[axis as usize] = len;
    let mask = Tensor::ones(shape.as_slice(), (latents.kind(), latents.device()));
    let _ = mask.narrow(axis, 0, fh).fill_(0.0);
    mask
}

/// Shapes of the extras, for error messages.
fn shapes(text: &TextConditioning) -> BTreeMap<&str, Vec<i64>> {
    text.extras.iter().map(|(k, t)| (k.as_str(), t.size())).collect()
}
