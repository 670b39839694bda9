//! Building blocks whose variables are named like the checkpoint keys, and the LoRA-aware linear
//! layer. A [`Scope`] is a position in the module tree: `scope / "attn" / "to_q"`.

use std::ops::Div;

use tch::nn::{Init, Path};
use tch::{Kind, Tensor};

use crate::flops;
use crate::lora::{AdapterSwitch, LoraConfig, LoraPair};

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
}

impl<'a> Scope<'a> {
    /// The root of a model's tree.
    pub fn root(path: Path<'a>, lora: Option<LoraScope<'a>>) -> Self {
        Self { path, name: String::new(), lora, deferred: false }
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
        let lora = self.lora.as_ref().filter(|l| l.config.targets(&self.name)).map(|l| {
            let r = l.config.rank_of(&self.name);
            let (a_path, b_path) = (&l.path / "lora_A", &l.path / "lora_B");
            // Values come from `Adapters::initialize`, seeded and machine-independent.
            let a = a_path.var("weight", &[r, input], Init::Const(0.0));
            let b = b_path.var("weight", &[output, r], Init::Const(0.0));
            (LoraPair { a, b, scale: l.config.scale_of(&self.name) }, l.switch.clone())
        });
        Linear { weight, bias, lora }
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
        }
    }
}

/// `y = x·Wᵀ + b (+ (α/r)·B·A·x when the adapter is on)`.
#[derive(Debug)]
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub lora: Option<(LoraPair, AdapterSwitch)>,
}

impl Linear {
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let y = x.linear(&self.weight, self.bias.as_ref());
        let (out, width) = (self.weight.size()[0], self.weight.size()[1]);
        let mut work = 2.0 * (width * out) as f64;
        let y = match &self.lora {
            Some((pair, switch)) if switch.enabled() => {
                work += 2.0 * (pair.a.size()[0] * (width + out)) as f64;
                let delta = x
                    .to_kind(pair.a.kind())
                    .linear::<Tensor>(&pair.a, None)
                    .linear::<Tensor>(&pair.b, None)
                    * pair.scale;
                y + delta.to_kind(x.kind())
            }
            _ => y,
        };
        flops::add(work * flops::rows(x, width), &y);
        y
    }
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
    let out = Tensor::scaled_dot_product_attention(q, k, v, bias, 0.0, causal, scale, false);
    // (…, Sq, d) against (…, Sk, d): Sq·Sk·d multiply-adds for the scores and as many for values.
    let sk = k.size()[k.dim() - 2];
    let work = 4.0 * q.numel() as f64 * sk as f64;
    flops::add(work, &out);
    LARGEST_ATTENTION.with(|largest| {
        if work > largest.get().0 {
            // SDPA's own choice for these inputs (a host-side check, no synchronisation).
            let choice =
                Tensor::f_internal_fused_sdp_choice(q, k, v, bias, 0.0, causal, scale, false);
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
