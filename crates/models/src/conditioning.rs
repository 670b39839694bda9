//! What a denoiser is conditioned on besides latents and time: the encoded prompt, with whatever
//! a family adds (a pooled vector, an attention mask, per-row extras such as a guidance value or
//! image shapes). Every tensor has the batch as its first dimension, so selecting, slicing and
//! stacking rows works the same for every family.

use std::collections::{BTreeMap, HashMap};

use tch::Tensor;

use crate::ModelError;

/// Text conditioning of a denoiser, one row per sample.
pub struct TextConditioning {
    /// (B, L, D) token states.
    pub embeds: Tensor,
    /// (B, P) pooled text, where the model takes one (SD3, Flux).
    pub pooled: Option<Tensor>,
    /// (B, L) 1 for tokens, 0 for padding, where the model masks attention (Qwen-Image, Wan).
    pub mask: Option<Tensor>,
    /// Per-row extras a family's denoiser reads by name, each (B, …): e.g. `guidance` (B,) for
    /// Flux [dev], `img_shapes` (B, 3) for Qwen-Image.
    pub extras: BTreeMap<String, Tensor>,
}

impl TextConditioning {
    /// Token states and an optional pooled vector; no mask, no extras.
    pub fn new(embeds: Tensor, pooled: Option<Tensor>) -> Self {
        Self { embeds, pooled, mask: None, extras: BTreeMap::new() }
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

    /// The same conditioning with `f` applied to every per-row tensor.
    pub fn map_rows(&self, f: impl Fn(&Tensor) -> Tensor) -> Self {
        Self {
            embeds: f(&self.embeds),
            pooled: self.pooled.as_ref().map(&f),
            mask: self.mask.as_ref().map(&f),
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
            extras: self
                .extras
                .iter()
                .filter_map(|(k, a)| other.extras.get(k).map(|b| (k.clone(), cat(a, b))))
                .collect(),
        }
    }

    /// The rows at `index` (a 1-D int64 tensor).
    pub fn rows(&self, index: &Tensor) -> Self {
        self.map_rows(|t| t.index_select(0, index))
    }

    /// Rows `start .. start + len`.
    pub fn narrow(&self, start: i64, len: i64) -> Self {
        self.map_rows(|t| t.narrow(0, start, len))
    }
}
