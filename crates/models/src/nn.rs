//! Building blocks whose variables are named like the checkpoint keys, and the LoRA-aware linear
//! layer. A [`Scope`] is a position in the module tree: `scope / "attn" / "to_q"`.

use std::cell::Cell;
use std::ops::Div;

use tch::nn::{Init, Path};
use tch::{Kind, Tensor};

use crate::flops;
use crate::lora::{AdapterSwitch, LoraConfig, LoraPair};
use crate::switch::{Fusing, Switch};

/// Where adapters are created while a model is built.
#[derive(Clone)]
pub struct LoraScope<'a> {
    pub path: Path<'a>,
    pub config: &'a LoraConfig,
    pub switch: AdapterSwitch,
}

/// A position in the module tree: the base variables' path, its dotted name, and (with LoRA) the
/// adapters' path.
#[derive(Clone)]
pub struct Scope<'a> {
    pub path: Path<'a>,
    pub name: String,
    pub lora: Option<LoraScope<'a>>,
    /// Variables are made in host memory, their blocks to be read when sharded
    /// ([`crate::shard_load`]).
    pub deferred: bool,
    /// Whether [`project`] runs the layers [`Self::linears`] makes as one GEMM, and their record.
    pub fuse: Fusing,
}

impl<'a> Scope<'a> {
    /// The root of a model's tree.
    pub fn root(path: Path<'a>, lora: Option<LoraScope<'a>>) -> Self {
        Self { path, name: String::new(), lora, deferred: false, fuse: Fusing::default() }
    }

    /// A variable at this position, named `name`, in its store's kind and on its device, left
    /// uninitialised: every one is filled by a checkpoint load or a random writer, so building a
    /// model writes no memory (the pages of a CPU tensor are taken only when it is filled).
    pub fn var(&self, name: &str, dims: &[i64]) -> Tensor {
        let device = if self.deferred { tch::Device::Cpu } else { self.path.device() };
        let empty = Tensor::empty(dims, (self.path.kind(), device));
        self.path.add(name, empty, true)
    }

    /// A linear layer (`weight`: out × in, optional `bias`), with an adapter when LoRA targets it.
    pub fn linear(&self, input: i64, output: i64, bias: bool) -> Linear {
        let weight = self.var("weight", &[output, input]);
        let bias = bias.then(|| self.var("bias", &[output]));
        Linear { weight, bias, lora: self.adapter(input, output), fuse: None }
    }

    /// Linear layers on one input, `(name, output)` each: their weights (and biases) are
    /// consecutive rows of one tensor, so that [`project`] can run them as one GEMM. The
    /// variables and adapters are named as [`Self::linear`]'s.
    pub fn linears<const N: usize>(
        &self,
        input: i64,
        outputs: [(&str, i64); N],
        bias: bool,
    ) -> [Linear; N] {
        self.linears_at(input, outputs.map(|(name, output)| (self / name, output)), bias)
    }

    /// [`Self::linears`] at positions `outputs` anywhere in the tree (a block's attention
    /// projections and its MLP's input, say).
    pub fn linears_at<const N: usize>(
        &self,
        input: i64,
        outputs: [(Scope<'a>, i64); N],
        bias: bool,
    ) -> [Linear; N] {
        let total: i64 = outputs.iter().map(|(_, o)| o).sum();
        let device = if self.deferred { tch::Device::Cpu } else { self.path.device() };
        let options = (self.path.kind(), device);
        let weights = Tensor::empty([total, input], options);
        let biases = bias.then(|| Tensor::empty([total], options));
        let names =
            |what: &str| outputs.iter().map(|(s, _)| format!("{}.{what}", s.name)).collect();
        self.fuse.record(names("weight"));
        if bias {
            self.fuse.record(names("bias"));
        }
        let mut start = 0;
        outputs.map(|(scope, output)| {
            let weight = scope.path.add("weight", weights.narrow(0, start, output), true);
            let bias =
                biases.as_ref().map(|b| scope.path.add("bias", b.narrow(0, start, output), true));
            start += output;
            Linear {
                weight,
                bias,
                lora: scope.adapter(input, output),
                fuse: Some(self.fuse.switch.clone()),
            }
        })
    }

    /// The adapter of a linear layer here, when LoRA targets it.
    fn adapter(&self, input: i64, output: i64) -> Option<(LoraPair, AdapterSwitch)> {
        self.lora.as_ref().filter(|l| l.config.targets(&self.name)).map(|l| {
            let r = l.config.rank_of(&self.name);
            let (a_path, b_path) = (&l.path / "lora_A", &l.path / "lora_B");
            // Values come from `Adapters::initialize`, seeded and machine-independent.
            let a = a_path.var("weight", &[r, input], Init::Const(0.0));
            let b = b_path.var("weight", &[output, r], Init::Const(0.0));
            (LoraPair { a, b, scale: l.config.scale_of(&self.name) }, l.switch.clone())
        })
    }

    /// A 2-D convolution (`weight`: out × in × k × k, `bias`).
    pub fn conv2d(
        &self,
        input: i64,
        output: i64,
        kernel: i64,
        stride: i64,
        padding: i64,
    ) -> Conv2d {
        Conv2d {
            weight: self.var("weight", &[output, input, kernel, kernel]),
            bias: self.var("bias", &[output]),
            stride,
            padding,
        }
    }
}

impl<'a, T: ToString> Div<T> for &Scope<'a> {
    type Output = Scope<'a>;

    fn div(self, child: T) -> Scope<'a> {
        let child = child.to_string();
        let name =
            if self.name.is_empty() { child.clone() } else { format!("{}.{child}", self.name) };
        Scope {
            path: &self.path / &child,
            name,
            lora: self.lora.as_ref().map(|l| LoraScope { path: &l.path / &child, ..l.clone() }),
            deferred: self.deferred,
            fuse: self.fuse.clone(),
        }
    }
}

/// `y = x·Wᵀ + b (+ (α/r)·B·A·x when the adapter is on)`.
#[derive(Debug)]
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub lora: Option<(LoraPair, AdapterSwitch)>,
    /// Made by [`Scope::linears`], with its model's fusing switch.
    pub fuse: Option<Switch>,
}

impl Linear {
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let y = x.linear(&self.weight, self.bias.as_ref());
        let width = self.weight.size()[1];
        let y = match self.adapter() {
            Some(pair) => {
                y + pair.delta(&x.to_kind(pair.a.kind()).linear::<Tensor>(&pair.a, None), x.kind())
            }
            None => y,
        };
        flops::add(self.work() * flops::rows(x, width), &y);
        y
    }

    /// The adapter, while it is switched on.
    fn adapter(&self) -> Option<&LoraPair> {
        self.lora.as_ref().filter(|(_, switch)| switch.enabled()).map(|(pair, _)| pair)
    }

    /// Multiply-adds ×2 per input row, adapter included.
    fn work(&self) -> f64 {
        let (out, width) = (self.weight.size()[0], self.weight.size()[1]);
        let rank = self.adapter().map_or(0, |pair| pair.a.size()[0]);
        2.0 * (width * out + rank * (width + out)) as f64
    }
}

/// The outputs of `layers` on one input `x`, as each one's [`Linear::forward`] gives them. Layers
/// made together by [`Scope::linears`] run as one GEMM over their weights' rows (when fusing is
/// on and the weights are frozen and still lie together: sharded or replaced weights run apart),
/// and their adapters' A matrices as one more.
pub fn project<const N: usize>(x: &Tensor, layers: [&Linear; N]) -> [Tensor; N] {
    let Some((weight, bias)) = fused_weights(&layers) else {
        return layers.map(|l| l.forward(x));
    };
    let sizes: Vec<i64> = layers.iter().map(|l| l.weight.size()[0]).collect();
    let y = x.linear(&weight, bias.as_ref());
    let mut outs = y.split_with_sizes(sizes.as_slice(), -1);
    let adapted: Vec<(usize, &LoraPair)> =
        layers.iter().enumerate().filter_map(|(i, l)| l.adapter().map(|p| (i, p))).collect();
    if let Some((_, first)) = adapted.first() {
        let a = Tensor::cat(&adapted.iter().map(|(_, p)| &p.a).collect::<Vec<_>>(), 0);
        let ranks: Vec<i64> = adapted.iter().map(|(_, p)| p.a.size()[0]).collect();
        let down = x.to_kind(first.a.kind()).linear::<Tensor>(&a, None);
        for ((i, pair), down) in adapted.iter().zip(down.split_with_sizes(ranks.as_slice(), -1)) {
            outs[*i] = &outs[*i] + pair.delta(&down, x.kind());
        }
    }
    FUSED_GEMMS.with(|count| count.set(count.get() + 1));
    let width = weight.size()[1];
    for (layer, out) in layers.iter().zip(&outs) {
        flops::add(layer.work() * flops::rows(x, width), out);
    }
    <[Tensor; N]>::try_from(outs).expect("one output per layer")
}

thread_local! {
    static FUSED_GEMMS: Cell<u64> = const { Cell::new(0) };
}

/// How many fused GEMMs [`project`] has run on this thread.
pub fn fused_gemms() -> u64 {
    FUSED_GEMMS.with(Cell::get)
}

/// The weights (and biases) of `layers` as one tensor each, when [`project`] can fuse them:
/// frozen, contiguous and consecutive in one tensor. (Trained weights run apart even without
/// autograd, so that a block recomputed in backward rounds as its first forward did.)
fn fused_weights(layers: &[&Linear]) -> Option<(Tensor, Option<Tensor>)> {
    let first = layers.first()?;
    if !first.fuse.as_ref().is_some_and(Switch::enabled) {
        return None;
    }
    let together = |parts: &[&Tensor]| -> Option<Tensor> {
        let head = parts[0];
        let mut next = head.data_ptr() as usize;
        for t in parts {
            let frozen = !t.requires_grad() && t.is_contiguous();
            let same = t.kind() == head.kind() && t.device() == head.device();
            if !frozen
                || !same
                || t.data_ptr() as usize != next
                || t.size()[1..] != head.size()[1..]
            {
                return None;
            }
            next += t.numel() * t.kind().elt_size_in_bytes();
        }
        let mut size = head.size();
        size[0] = parts.iter().map(|t| t.size()[0]).sum();
        let mut stride = vec![1i64; size.len()];
        for d in (0..size.len().saturating_sub(1)).rev() {
            stride[d] = stride[d + 1] * size[d + 1];
        }
        // A view of the first one's storage: refused when the rows lie beyond it.
        head.f_as_strided(size.as_slice(), stride.as_slice(), None::<i64>).ok()
    };
    let weights: Vec<&Tensor> = layers.iter().map(|l| &l.weight).collect();
    let weight = together(&weights)?;
    let bias = match layers.iter().map(|l| l.bias.as_ref()).collect::<Option<Vec<_>>>() {
        Some(biases) => Some(together(&biases)?),
        None if layers.iter().all(|l| l.bias.is_none()) => None,
        None => return None,
    };
    Some((weight, bias))
}

/// A 2-D convolution with bias.
#[derive(Debug)]
pub struct Conv2d {
    pub weight: Tensor,
    pub bias: Tensor,
    pub stride: i64,
    pub padding: i64,
}

impl Conv2d {
    pub fn forward(&self, x: &Tensor) -> Tensor {
        x.conv2d(&self.weight, Some(&self.bias), [self.stride; 2], [self.padding; 2], [1, 1], 1)
    }
}

/// Layer norm over the last dimension without affine parameters.
pub fn layer_norm(x: &Tensor, eps: f64) -> Tensor {
    let dim = *x.size().last().expect("a tensor with dimensions");
    x.layer_norm([dim], None::<Tensor>, None::<Tensor>, eps, true)
}

/// RMS norm over the last dimension with a learned scale (diffusers' `RMSNorm`: statistics in f32,
/// result in the weight's dtype when that is half precision).
#[derive(Debug)]
pub struct RmsNorm {
    pub weight: Tensor,
    pub eps: f64,
}

impl RmsNorm {
    pub fn new(scope: &Scope<'_>, dim: i64, eps: f64) -> Self {
        Self { weight: scope.var("weight", &[dim]), eps }
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        let variance = x.to_kind(Kind::Float).square().mean_dim(-1, true, Kind::Float);
        let normed = x * (variance + self.eps).rsqrt();
        let normed = match self.weight.kind() {
            Kind::Half | Kind::BFloat16 => normed.to_kind(self.weight.kind()),
            _ => normed,
        };
        normed * &self.weight
    }
}

/// GELU with the tanh approximation (`gelu-approximate`).
pub fn gelu_tanh(x: &Tensor) -> Tensor {
    x.gelu("tanh")
}

/// Layer norm over the last dimension with `weight` and `bias`.
#[derive(Debug)]
pub struct LayerNorm {
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f64,
}

impl LayerNorm {
    pub fn new(scope: &Scope<'_>, dim: i64, eps: f64) -> Self {
        Self { weight: scope.var("weight", &[dim]), bias: scope.var("bias", &[dim]), eps }
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        x.layer_norm([self.weight.size()[0]], Some(&self.weight), Some(&self.bias), self.eps, true)
    }
}

/// Group norm over channels (dim 1) with `weight` and `bias`.
#[derive(Debug)]
pub struct GroupNorm {
    pub weight: Tensor,
    pub bias: Tensor,
    pub groups: i64,
    pub eps: f64,
}

impl GroupNorm {
    pub fn new(scope: &Scope<'_>, groups: i64, channels: i64, eps: f64) -> Self {
        Self {
            weight: scope.var("weight", &[channels]),
            bias: scope.var("bias", &[channels]),
            groups,
            eps,
        }
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        x.group_norm(self.groups, Some(&self.weight), Some(&self.bias), self.eps, true)
    }
}

/// A lookup table `weight` (vocab × dim).
#[derive(Debug)]
pub struct Embedding {
    pub weight: Tensor,
}

impl Embedding {
    pub fn new(scope: &Scope<'_>, vocab: i64, dim: i64) -> Self {
        Self { weight: scope.var("weight", &[vocab, dim]) }
    }

    pub fn forward(&self, ids: &Tensor) -> Tensor {
        Tensor::embedding(&self.weight, ids, -1, false, false)
    }
}

/// Scaled dot-product attention over (B, H, N, d) (libtorch's fused kernels, with backward):
/// `causal` masks future positions, `bias` is added to the scores, `scale` replaces 1/√d.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: Option<&Tensor>,
    causal: bool,
    scale: Option<f64>,
) -> Tensor {
    attention_with(q, k, v, bias, causal, scale, false)
}

/// [`attention`] with fewer key/value heads than query heads (grouped-query attention): each
/// key/value head serves `q heads / kv heads` consecutive query heads, read in place.
pub fn grouped_attention(q: &Tensor, k: &Tensor, v: &Tensor, bias: Option<&Tensor>) -> Tensor {
    attention_with(q, k, v, bias, false, None, true)
}

fn attention_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: Option<&Tensor>,
    causal: bool,
    scale: Option<f64>,
    gqa: bool,
) -> Tensor {
    let out = Tensor::scaled_dot_product_attention(q, k, v, bias, 0.0, causal, scale, gqa);
    // (…, Sq, d) against (…, Sk, d): Sq·Sk·d multiply-adds for the scores and as many for values.
    let sk = k.size()[k.dim() - 2];
    let work = 4.0 * q.numel() as f64 * sk as f64;
    flops::add(work, &out);
    LARGEST_ATTENTION.with(|largest| {
        if work > largest.get().0 {
            // SDPA's own choice for these inputs (a host-side check, no synchronisation).
            let choice =
                Tensor::f_internal_fused_sdp_choice(q, k, v, bias, 0.0, causal, scale, gqa);
            largest.set((work, choice.unwrap_or(-1)));
        }
    });
    out
}

thread_local! {
    /// The work and SDPA backend of the largest attention on this thread since the last take.
    static LARGEST_ATTENTION: std::cell::Cell<(f64, i64)> = const { std::cell::Cell::new((0.0, -1)) };
}

/// The kernel SDPA chose for the largest attention run on this thread since the last call
/// (`at::_fused_sdp_choice`: 0 math, 1 flash, 2 memory-efficient, 3 cuDNN, 4 overrideable), if
/// any ran; starts over.
pub fn take_attention_backend() -> Option<i64> {
    let (work, backend) = LARGEST_ATTENTION.with(|largest| largest.replace((0.0, -1)));
    (work > 0.0).then_some(backend)
}

/// The name of an SDPA backend code of [`take_attention_backend`].
pub fn attention_backend_name(code: i64) -> &'static str {
    match code {
        0 => "math",
        1 => "flash",
        2 => "memory_efficient",
        3 => "cudnn",
        4 => "overrideable",
        _ => "unknown",
    }
}

/// `FeedForward(dim, mult=4, "gelu-approximate")`: `net.0.proj` → GELU(tanh) → `net.2`.
pub struct FeedForward {
    pub proj_in: Linear,
    pub proj_out: Linear,
}

impl FeedForward {
    pub fn new(scope: &Scope<'_>, dim: i64) -> Self {
        Self::with_hidden(scope, dim, 4 * dim)
    }

    /// `FeedForward(dim, inner_dim=hidden, "gelu-approximate")`.
    pub fn with_hidden(scope: &Scope<'_>, dim: i64, hidden: i64) -> Self {
        let net = scope / "net";
        Self {
            proj_in: (&(&net / 0) / "proj").linear(dim, hidden, true),
            proj_out: (&net / 2).linear(hidden, dim, true),
        }
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        self.proj_out.forward(&gelu_tanh(&self.proj_in.forward(x)))
    }
}

/// Two linear layers with SiLU between (`TimestepEmbedding`, `PixArtAlphaTextProjection`).
pub struct Mlp {
    pub linear_1: Linear,
    pub linear_2: Linear,
}

impl Mlp {
    pub fn new(scope: &Scope<'_>, input: i64, dim: i64) -> Self {
        Self {
            linear_1: (scope / "linear_1").linear(input, dim, true),
            linear_2: (scope / "linear_2").linear(dim, dim, true),
        }
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        self.linear_2.forward(&self.linear_1.forward(x).silu())
    }
}

/// Channels of the sinusoidal timestep features.
pub const TIMESTEP_CHANNELS: i64 = 256;

/// diffusers' `get_timestep_embedding` with `flip_sin_to_cos = true`, shift 0: `[cos, sin]` of
/// `scale · t · exp(−ln(10⁴)·k/half)`.
pub fn timestep_features(timestep: &Tensor, channels: i64, scale: f64) -> Tensor {
    let half = channels / 2;
    let exponent =
        Tensor::arange(half, (Kind::Float, timestep.device())) * (-(10_000f64).ln() / half as f64);
    let args = timestep.to_kind(Kind::Float).unsqueeze(1) * exponent.exp().unsqueeze(0) * scale;
    Tensor::cat(&[args.cos(), args.sin()], -1)
}
