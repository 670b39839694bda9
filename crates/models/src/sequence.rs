//! Sequence parallelism (Ulysses): the S ranks of a group hold 1/S of every sample's tokens and
//! run everything but attention on those alone. Attention exchanges them: an all-to-all turns
//! (tokens/S, all heads) into (all tokens, heads/S), each rank attends over the whole sequence
//! with its heads, and the inverse all-to-all brings the output back to its tokens; backward runs
//! the reverse exchanges. Token counts that do not divide by S are padded at the end, and padded
//! keys are masked out of attention. The denoiser's output is all-gathered, so whatever follows
//! it (sampling, log-probabilities, losses) runs on whole samples, the same on every rank; its
//! gradient keeps each rank's own tokens, so the ranks' parameter gradients are partial sums that
//! add up (over the group) to the gradient of one process.

use std::sync::Arc;

use tch::{Kind, Tensor};

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
        let len = x.size()[dim as usize];
        let local = self.local_len(len);
        let start = self.rank() as i64 * local;
        let own = (len - start).clamp(0, local);
        let mine = x.narrow(dim, start.min(len), own);
        if own == local {
            return mine;
        }
        let mut shape = x.size();
        shape[dim as usize] = local - own;
        Tensor::cat(&[mine, Tensor::zeros(&shape, (x.kind(), x.device()))], dim)
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

    /// Self-attention of this rank's queries, keys and values (B, local, H, d) over the whole
    /// sequence of `len` tokens (padded keys masked); returns (B, local, H, d).
    pub fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, len: i64) -> Tensor {
        let all_tokens = |t: &Tensor| self.0.exchange(t, 2, 1).transpose(1, 2);
        let (q, k, v) = (all_tokens(q), all_tokens(k), all_tokens(v));
        let padded = k.size()[2];
        let mask = (padded > len).then(|| {
            Tensor::arange(padded, (Kind::Int64, q.device())).lt(len).view([1, 1, 1, padded])
        });
        let out = attention(&q, &k, &v, mask.as_ref(), false, None);
        self.0.exchange(&out.transpose(1, 2), 1, 2)
    }
}
