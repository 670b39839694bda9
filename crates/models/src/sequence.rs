//! Sequence parallelism (Ulysses): the S ranks of a group hold 1/S of every sample's tokens and
//! run everything but attention on those alone. Attention exchanges them: an all-to-all turns
//! (tokens/S, all heads) into (all tokens, heads/S), each rank attends over the whole sequence
//! with its heads, and the inverse all-to-all brings the output back to its tokens; backward runs
//! the reverse exchanges. Token counts that do not divide by S are padded at the end, and padded
//! keys are masked out of attention. Joint attention splits each stream (text, image) the same way,
//! so after the exchange the keys are rank 0's text and image, then rank 1's, … (the key mask
//! follows that order). The denoiser's output is all-gathered, so whatever follows
//! it (sampling, log-probabilities, losses) runs on whole samples, the same on every rank; its
//! gradient keeps each rank's own tokens, so the ranks' parameter gradients are partial sums that
//! add up (over the group) to the gradient of one process.

use std::sync::Arc;

use tch::{Device, Kind, Tensor};

use crate::nn::attention;
use crate::ModelError;

/// The collectives sequence parallelism needs, over the ranks of one group.
pub trait SequenceGroup: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Differentiable: `x` cut into `size` chunks along `scatter`, chunk r sent to rank r, the
    /// received chunks concatenated in rank order along `gather`; its gradient is the exchange
    /// back. Panics when a rank fails (a collective inside a forward has no error path).
    fn exchange(&self, x: &Tensor, scatter: i64, gather: i64) -> Tensor;
    /// Every rank's `x` (same shape), concatenated along dim 0 in rank order (not differentiable).
    fn all_gather(&self, x: &Tensor) -> Result<Tensor, ModelError>;
}

/// A sequence-parallel group and the key mask of one attention ([`SequenceParallel::key_mask`]),
/// when a block's tokens are this rank's shares.
pub type Split<'a> = Option<(&'a SequenceParallel, Option<&'a Tensor>)>;

/// A model's sequence-parallel group.
#[derive(Clone)]
pub struct SequenceParallel(pub Arc<dyn SequenceGroup>);

impl std::fmt::Debug for SequenceParallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SequenceParallel(rank {} of {})", self.rank(), self.size())
    }
}

impl SequenceParallel {
    pub fn rank(&self) -> usize {
        self.0.rank()
    }

    pub fn size(&self) -> usize {
        self.0.size()
    }

    /// Refuses a model whose `heads` do not divide by the group size.
    pub fn check_heads(&self, family: &str, heads: i64) -> Result<(), ModelError> {
        let s = self.size() as i64;
        if heads % s != 0 {
            return Err(ModelError::Input(format!(
                "trainer.sequence_parallel_size {s} does not divide {family}'s {heads} attention heads"
            )));
        }
        Ok(())
    }

    /// Tokens per rank for a sequence of `len`: ⌈len / S⌉.
    pub fn local_len(&self, len: i64) -> i64 {
        (len + self.size() as i64 - 1) / self.size() as i64
    }

    /// This rank's tokens of `x` along `dim` (a dim of size `len`), zero-padded at the end to
    /// S·⌈len / S⌉.
    pub fn split(&self, x: &Tensor, dim: i64) -> Tensor {
        self.split_for(x, dim, self.rank())
    }

    /// Rank `r`'s tokens of `x` along `dim`, as [`Self::split`] gives them to it.
    fn split_for(&self, x: &Tensor, dim: i64, r: usize) -> Tensor {
        let len = x.size()[dim as usize];
        let local = self.local_len(len);
        let start = r as i64 * local;
        let own = (len - start).clamp(0, local);
        let mine = x.narrow(dim, start.min(len), own);
        if own == local {
            return mine;
        }
        let mut shape = x.size();
        shape[dim as usize] = local - own;
        Tensor::cat(&[mine, Tensor::zeros(&shape, (x.kind(), x.device()))], dim)
    }

    /// The key mask of [`Self::attention`] (B, 1, 1, keys) when each rank's tokens are its
    /// shares of `streams` concatenated in that order (text then image, say): each stream's
    /// length and optional mask (B, len) of the whole sequence (nonzero: a token to attend to).
    /// After the exchange the keys are rank 0's streams, then rank 1's, …; padding is masked.
    /// None when nothing is masked.
    pub fn key_mask(&self, streams: &[(i64, Option<&Tensor>)], device: Device) -> Option<Tensor> {
        let s = self.size() as i64;
        if streams.iter().all(|(len, mask)| mask.is_none() && len % s == 0) {
            return None;
        }
        let full: Vec<Tensor> = streams
            .iter()
            .map(|(len, mask)| match mask {
                Some(m) => Tensor::ne(m, 0),
                None => Tensor::ones([1, *len], (Kind::Bool, device)),
            })
            .collect();
        let rows = full.iter().map(|m| m.size()[0]).max().unwrap_or(1);
        let parts: Vec<Tensor> = (0..self.size())
            .flat_map(|r| full.iter().map(move |m| (r, m)))
            .map(|(r, m)| self.split_for(&m.expand([rows, -1], false), 1, r))
            .collect();
        let keys = Tensor::cat(&parts, 1);
        Some(keys.view([rows, 1, 1, -1]))
    }

    /// Every rank's tokens of `x` (B, local, …) along dim 1, the padding dropped: (B, len, …).
    /// Differentiable for this rank's tokens only: every rank computes the same thing from the
    /// result, so each keeps its own part of the gradient.
    pub fn gather(&self, x: &Tensor, len: i64) -> Result<Tensor, ModelError> {
        let s = self.size() as i64;
        let others = self.0.all_gather(&x.detach().transpose(0, 1).contiguous())?;
        let mut parts: Vec<Tensor> =
            others.chunk(s, 0).into_iter().map(|t| t.transpose(0, 1)).collect();
        parts[self.rank()] = x.shallow_clone();
        Ok(Tensor::cat(&parts, 1).narrow(1, 0, len))
    }

    /// Self-attention of this rank's queries, keys and values (B, local, H, d) over every rank's
    /// tokens, keys masked by `mask` ([`Self::key_mask`]); returns (B, local, H, d).
    pub fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Tensor {
        let all_tokens = |t: &Tensor| self.0.exchange(t, 2, 1).transpose(1, 2);
        let (q, k, v) = (all_tokens(q), all_tokens(k), all_tokens(v));
        let out = attention(&q, &k, &v, mask, false, None);
        self.0.exchange(&out.transpose(1, 2), 1, 2)
    }
}
