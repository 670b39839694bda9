//! Sequence parallelism (Ulysses): the S ranks of a group hold 1/S of every sample's tokens and
//! run everything but attention on those alone. Attention exchanges them: an all-to-all turns
//! (tokens/S, all heads) into (all tokens, heads/S), each rank attends over the whole sequence
//! with its heads, and the inverse all-to-all brings the output back to its tokens; backward runs
//! the reverse exchanges. The denoiser's output is all-gathered, so whatever follows it
//! (sampling, log-probabilities, losses) runs on whole samples, the same on every rank; its
//! gradient keeps each rank's own tokens, so the ranks' parameter gradients are partial sums that
//! add up (over the group) to the gradient of one process.
//!
//! A family declares what is split, as diffusers' `_cp_plan` does: a constant list of [`Stream`]s,
//! each a tensor of its forward, the dim its tokens lie along and its [`Role`] (keys of the joint
//! attention, in the order the attention concatenates them, or per-token values that go with
//! them: positions, modulations). The forward hands those tensors to
//! [`crate::model_weights::ModelWeights::split_sequence`] and gets them back as this rank's shares
//! with a [`Split`], which gives each attention its [`Keys`] and gathers the output; without a
//! group the tensors come back as they are and attention runs plain, so a forward has no
//! sequence-parallel branch of its own. Token counts that do not divide by S are padded at the
//! end and the padding is masked out of attention: after the exchange the keys are rank 0's
//! share of each key stream, then rank 1's, … ([`SequenceParallel::key_mask`]).
//!
//! A failed exchange inside a block is an error, not a panic: the model's [`Ulysses`] keeps it,
//! attention returns zeros without exchanging until the block returns, and the block fails
//! ([`crate::model_weights::ModelWeights::run_block`]: the forward's error, or autograd's backward
//! with its message when backward recomputes the block); a failed exchange of gradients fails
//! autograd's backward.

use std::sync::{Arc, Mutex, MutexGuard};

use tch::{Device, Kind, Tensor};

use crate::nn::attention;
use crate::ModelError;

/// The collectives sequence parallelism needs, over the ranks of one group.
pub trait SequenceGroup: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Differentiable: `x` cut into `size` chunks along `scatter`, chunk r sent to rank r, the
    /// received chunks concatenated in rank order along `gather`; its gradient is the exchange
    /// back (whose failure fails autograd's backward).
    fn exchange(&self, x: &Tensor, scatter: i64, gather: i64) -> Result<Tensor, ModelError>;
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
        local_len(len, self.size())
    }

    /// This rank's tokens of `x` along `dim` (a dim of size `len`), zero-padded at the end to
    /// S·⌈len / S⌉.
    pub fn split(&self, x: &Tensor, dim: i64) -> Tensor {
        share(x, dim, self.rank(), self.size())
    }

    /// The key mask of [`Self::attention`] (B, 1, 1, keys) when each rank's tokens are its
    /// shares of `streams` concatenated in that order (text then image, say): each stream's
    /// length and optional mask (B, len) of the whole sequence (nonzero: a token to attend to).
    /// After the exchange the keys are rank 0's streams, then rank 1's, …; padding is masked.
    /// None when nothing is masked.
    pub fn key_mask(&self, streams: &[(i64, Option<&Tensor>)], device: Device) -> Option<Tensor> {
        key_mask(streams, self.size(), device)
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
    pub fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<Tensor, ModelError> {
        let all_tokens =
            |t: &Tensor| Ok::<_, ModelError>(self.0.exchange(t, 2, 1)?.transpose(1, 2));
        let (q, k, v) = (all_tokens(q)?, all_tokens(k)?, all_tokens(v)?);
        let out = attention(&q, &k, &v, mask, false, None);
        self.0.exchange(&out.transpose(1, 2), 1, 2)
    }
}

/// ⌈len / size⌉.
fn local_len(len: i64, size: usize) -> i64 {
    (len + size as i64 - 1) / size as i64
}

/// Rank `r`'s tokens of `x` along `dim` among `size` ranks, zero-padded at the end to
/// ⌈len / size⌉.
fn share(x: &Tensor, dim: i64, r: usize, size: usize) -> Tensor {
    let len = x.size()[dim as usize];
    let local = local_len(len, size);
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

/// [`SequenceParallel::key_mask`] over `size` ranks (one: the plain mask of the streams).
fn key_mask(streams: &[(i64, Option<&Tensor>)], size: usize, device: Device) -> Option<Tensor> {
    if streams.iter().all(|(len, mask)| mask.is_none() && len % size as i64 == 0) {
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
    let parts: Vec<Tensor> = (0..size)
        .flat_map(|r| full.iter().map(move |m| (r, m)))
        .map(|(r, m)| share(&m.expand([rows, -1], false), 1, r, size))
        .collect();
    let keys = Tensor::cat(&parts, 1);
    Some(keys.view([rows, 1, 1, -1]))
}

/// A model's sequence-parallel group and the first exchange that failed inside one of its blocks,
/// kept until [`crate::model_weights::ModelWeights::run_block`] (or [`Split::gather`]) reports it.
pub struct Ulysses {
    group: SequenceParallel,
    failure: Mutex<Option<ModelError>>,
}

impl std::fmt::Debug for Ulysses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.group.fmt(f)
    }
}

impl Ulysses {
    pub fn new(group: SequenceParallel) -> Self {
        Self { group, failure: Mutex::new(None) }
    }

    /// The failure kept by [`Self::attention`], if any.
    pub fn take_failure(&self) -> Option<ModelError> {
        self.failure().take()
    }

    fn failure(&self) -> MutexGuard<'_, Option<ModelError>> {
        self.failure.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`SequenceParallel::attention`]; when an exchange fails the failure is kept and the
    /// output is zeros, as it is without exchanging while a failure is kept.
    fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Tensor {
        if self.failure().is_none() {
            match self.group.attention(q, k, v, mask) {
                Ok(out) => return out,
                Err(e) => *self.failure() = Some(e),
            }
        }
        v.zeros_like()
    }
}

/// What sequence parallelism does with a [`Stream`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Keys of the joint attention, every token attended to.
    Keys,
    /// Keys, of which the mask given to [`Split::new`] (B, len; nonzero: attended to) says which
    /// count (a padded caption).
    MaskedKeys,
    /// Per-token values that go with a key stream's tokens (positions, modulations).
    Follows,
}

/// A tensor of a family's forward that sequence parallelism splits (an entry of diffusers'
/// `_cp_plan`). A family lists its streams in a constant, key streams in the order its joint
/// attention concatenates them.
#[derive(Debug, Clone, Copy)]
pub struct Stream {
    /// The forward's name for it.
    pub name: &'static str,
    /// The dim its tokens lie along.
    pub dim: i64,
    /// What it is to attention.
    pub role: Role,
}

/// One forward's streams split over the model's group ([`Split::new`]): the key streams'
/// lengths and masks, for each attention's [`Keys`], and the gather of the output.
pub struct Split<'a> {
    ulysses: Option<&'a Ulysses>,
    /// The key streams in attention order: name, whole length, mask.
    keys: Vec<(&'static str, i64, Option<Tensor>)>,
    device: Device,
}

impl<'a> Split<'a> {
    /// `tensors` (one per entry of `streams`, in its order) as this rank's shares when `ulysses`
    /// splits the model's tokens, as they are otherwise; `mask` is the [`Role::MaskedKeys`]
    /// stream's.
    pub fn new<const N: usize>(
        ulysses: Option<&'a Ulysses>,
        streams: &[Stream; N],
        tensors: [Tensor; N],
        mask: Option<&Tensor>,
    ) -> (Self, [Tensor; N]) {
        let keys = (streams.iter().zip(&tensors))
            .filter(|(s, _)| s.role != Role::Follows)
            .map(|(s, t)| {
                let mask = mask.filter(|_| s.role == Role::MaskedKeys);
                (s.name, t.size()[s.dim as usize], mask.map(Tensor::shallow_clone))
            })
            .collect();
        let device = tensors.first().map_or(Device::Cpu, Tensor::device);
        let split = Self { ulysses, keys, device };
        let shares = std::array::from_fn(|i| split.split(&streams[i], &tensors[i]));
        (split, shares)
    }

    /// `x` as [`Self::new`] gives back a tensor of `stream` (for one that a forward has only
    /// sometimes).
    pub fn split(&self, stream: &Stream, x: &Tensor) -> Tensor {
        match self.ulysses {
            Some(u) => u.group.split(x, stream.dim),
            None => x.shallow_clone(),
        }
    }

    /// The keys of the joint attention: every key stream, in the declared order.
    pub fn keys(&self) -> Keys<'a> {
        self.keys_where(|_| true)
    }

    /// The keys of an attention over the key stream `name` alone.
    pub fn keys_of(&self, name: &str) -> Keys<'a> {
        self.keys_where(|n| n == name)
    }

    fn keys_where(&self, which: impl Fn(&str) -> bool) -> Keys<'a> {
        let streams: Vec<(i64, Option<&Tensor>)> = (self.keys.iter())
            .filter(|(name, ..)| which(name))
            .map(|(_, len, mask)| (*len, mask.as_ref()))
            .collect();
        let size = self.ulysses.map_or(1, |u| u.group.size());
        Keys { ulysses: self.ulysses, mask: key_mask(&streams, size, self.device) }
    }

    /// How many leading tokens of this rank's share of the key stream `name` an output of its
    /// first `len` tokens is computed on: with a group, the whole share (the gather drops the
    /// padding); `len` otherwise.
    pub fn output_tokens(&self, name: &str, len: i64) -> i64 {
        let whole = self.keys.iter().find(|(n, ..)| *n == name).map(|(_, l, _)| *l);
        match (self.ulysses, whole) {
            (Some(u), Some(whole)) => u.group.local_len(whole),
            _ => len,
        }
    }

    /// The output from this rank's tokens `x` (B, local, …): every rank's, the padding dropped
    /// (B, len, …); `x` itself without a group. An exchange that failed since the last block
    /// fails it.
    pub fn gather(&self, x: Tensor, len: i64) -> Result<Tensor, ModelError> {
        let Some(u) = self.ulysses else { return Ok(x) };
        match u.take_failure() {
            Some(e) => Err(e),
            None => u.group.gather(&x, len),
        }
    }
}

/// The keys of one attention ([`Split::keys`]): this rank's shares over the model's group, or
/// every token without one, and their mask. A block's closure owns its copy (a checkpointed block
/// reruns it in backward). The default: plain attention, nothing masked.
#[derive(Default)]
pub struct Keys<'a> {
    ulysses: Option<&'a Ulysses>,
    mask: Option<Tensor>,
}

impl Clone for Keys<'_> {
    fn clone(&self) -> Self {
        Self { ulysses: self.ulysses, mask: self.mask.as_ref().map(Tensor::shallow_clone) }
    }
}

impl Keys<'_> {
    /// Attention of queries, keys and values (B, N, H, d) → (B, N, H, d): through Ulysses over
    /// the group's tokens with one, plain otherwise.
    pub fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
        let mask = self.mask.as_ref();
        match self.ulysses {
            Some(u) => u.attention(q, k, v, mask),
            None => {
                let t = |x: &Tensor| x.transpose(1, 2);
                attention(&t(q), &t(k), &t(v), mask, false, None).transpose(1, 2)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::wan::{write_tiny_wan, TinyWanSpec, WanTransformer};
    use crate::{Denoiser, TextConditioning, TrainableDenoiser};

    /// A group of one whose exchanges fail while `failing` is set, as when another rank is gone.
    struct Flaky {
        failing: AtomicBool,
    }

    impl SequenceGroup for Flaky {
        fn rank(&self) -> usize {
            0
        }

        fn size(&self) -> usize {
            1
        }

        fn exchange(&self, x: &Tensor, _: i64, _: i64) -> Result<Tensor, ModelError> {
            match self.failing.load(Ordering::Relaxed) {
                true => Err(ModelError::Collective("rank 1 is gone".into())),
                false => Ok(x.shallow_clone()),
            }
        }

        fn all_gather(&self, x: &Tensor) -> Result<Tensor, ModelError> {
            Ok(x.shallow_clone())
        }
    }

    #[test]
    fn a_failed_exchange_is_an_error_naming_it_in_forward_and_backward() {
        let dir = tempfile::tempdir().unwrap();
        write_tiny_wan(dir.path(), &TinyWanSpec::default()).unwrap();
        let path = dir.path().join("transformer");
        let model = WanTransformer::load(&path, Device::Cpu, Kind::Float, None).unwrap();
        let group = Arc::new(Flaky { failing: AtomicBool::new(true) });
        model.sequence_parallel(SequenceParallel(group.clone())).unwrap();
        let c = &model.config;
        let latents = Tensor::randn([1, c.in_channels, 2, 4, 4], (Kind::Float, Device::Cpu));
        let text = TextConditioning::new(
            Tensor::randn([1, 5, c.text_dim], (Kind::Float, Device::Cpu)),
            None,
        );
        let t = Tensor::from_slice(&[500.0f32]);
        let velocity = || model.velocity(&latents, &t, &text);

        for checkpointing in [false, true] {
            model.set_gradient_checkpointing(checkpointing);
            let err = velocity().unwrap_err();
            assert!(matches!(err, ModelError::Collective(_)), "{err}");
            assert!(err.to_string().contains("rank 1 is gone"), "{err}");
            let err = tch::no_grad(velocity).unwrap_err();
            assert!(err.to_string().contains("rank 1 is gone"), "{err}");
        }

        // Fails in backward, when a checkpointed block's exchanges run again.
        group.failing.store(false, Ordering::Relaxed);
        let v = velocity().unwrap();
        group.failing.store(true, Ordering::Relaxed);
        let err = v.sum(Kind::Float).f_backward().unwrap_err();
        assert!(err.to_string().contains("rank 1 is gone"), "{err}");

        // Nothing of the failure stays behind once the group works again.
        group.failing.store(false, Ordering::Relaxed);
        velocity().unwrap().sum(Kind::Float).backward();
    }
}
