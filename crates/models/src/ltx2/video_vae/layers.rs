//! The layers of LTX-2's video VAE, named like the checkpoint keys: convolutions causal (or
//! centred) in time by repeating the edge frames, RMS norms over channels, the timestep
//! embedder, resnets with optional timestep modulation, and space-to-depth / depth-to-space
//! resampling.

use tch::{Kind, Tensor};

use super::config::Padding;
use crate::nn::{timestep_features, LayerNorm, Mlp, Scope, TIMESTEP_CHANNELS};

/// `PerChannelRMSNorm`: `x / sqrt(mean over channels of x² + 1e-8)`.
pub(super) fn rms_channels(x: &Tensor) -> Tensor {
    x / (x.square().mean_dim(1, true, x.kind()) + 1e-8).sqrt()
}

/// A 3×3×3 convolution (`conv.weight`, `conv.bias`) whose time axis is padded with copies of
/// the first frame (causal) or of the first and last (centred), and whose spatial axes are
/// padded by one in `padding`'s mode.
pub(super) struct CausalConv3d {
    weight: Tensor,
    bias: Tensor,
    stride: i64,
    padding: Padding,
}

impl CausalConv3d {
    pub fn new(s: &Scope<'_>, input: i64, output: i64, stride: i64, padding: Padding) -> Self {
        let conv = s / "conv";
        Self {
            weight: conv.var("weight", &[output, input, 3, 3, 3]),
            bias: conv.var("bias", &[output]),
            stride,
            padding,
        }
    }

    pub fn forward(&self, x: &Tensor, causal: bool) -> Tensor {
        let frames = x.size()[2];
        let first = x.narrow(2, 0, 1);
        let x = if causal {
            Tensor::cat(&[first.repeat([1, 1, 2, 1, 1]), x.shallow_clone()], 2)
        } else {
            Tensor::cat(&[first, x.shallow_clone(), x.narrow(2, frames - 1, 1)], 2)
        };
        let (x, pad) = match self.padding {
            Padding::Zeros => (x, 1),
            Padding::Mode(mode) => (x.pad([1, 1, 1, 1, 0, 0], mode, None), 0),
        };
        x.conv3d(&self.weight, Some(&self.bias), [self.stride; 3], [0, pad, pad], [1; 3], 1)
    }

    pub fn kind(&self) -> Kind {
        self.weight.kind()
    }
}

/// `PixArtAlphaCombinedTimestepSizeEmbeddings` without size conditions: sinusoidal features of
/// the timestep through `timestep_embedder` (linear, SiLU, linear), one row per sample.
pub(super) struct TimeEmbedder {
    mlp: Mlp,
}

impl TimeEmbedder {
    pub fn new(s: &Scope<'_>, dim: i64) -> Self {
        Self { mlp: Mlp::new(&(s / "timestep_embedder"), TIMESTEP_CHANNELS, dim) }
    }

    /// (B,) timesteps → (B, dim, 1, 1, 1) in `kind`.
    pub fn forward(&self, timestep: &Tensor, kind: Kind) -> Tensor {
        let features = timestep_features(timestep, TIMESTEP_CHANNELS, 1.0).to_kind(kind);
        self.mlp.forward(&features).unsqueeze(-1).unsqueeze(-1).unsqueeze(-1)
    }
}

/// `LTX2VideoResnetBlock3d`: RMS norm, (modulation,) SiLU, conv, twice, plus the input (through
/// `norm3` and a 1×1×1 `conv_shortcut` when the width changes).
pub(super) struct Resnet {
    conv1: CausalConv3d,
    conv2: CausalConv3d,
    shortcut: Option<(LayerNorm, Tensor, Tensor)>,
    /// (4, C): added to the embedded timestep for shift₁, scale₁, shift₂, scale₂.
    scale_shift_table: Option<Tensor>,
}

impl Resnet {
    pub fn new(
        s: &Scope<'_>,
        input: i64,
        output: i64,
        eps: f64,
        timestep: bool,
        padding: Padding,
    ) -> Self {
        let shortcut = (input != output).then(|| {
            let conv = s / "conv_shortcut";
            (
                LayerNorm::new(&(s / "norm3"), input, eps),
                conv.var("weight", &[output, input, 1, 1, 1]),
                conv.var("bias", &[output]),
            )
        });
        Self {
            conv1: CausalConv3d::new(&(s / "conv1"), input, output, 1, padding),
            conv2: CausalConv3d::new(&(s / "conv2"), output, output, 1, padding),
            shortcut,
            scale_shift_table: timestep.then(|| s.var("scale_shift_table", &[4, input])),
        }
    }

    /// `temb`: (B, 4C, 1, 1, 1) when the block is timestep-conditioned.
    pub fn forward(&self, x: &Tensor, temb: Option<&Tensor>, causal: bool) -> Tensor {
        let modulation = self.scale_shift_table.as_ref().map(|table| {
            let temb = temb.expect("a conditioned resnet gets the embedded timestep");
            let (b, c) = (temb.size()[0], table.size()[1]);
            let m = temb.view([b, 4, c, 1, 1, 1]) + table.view([1, 4, c, 1, 1, 1]);
            m.unbind(1)
        });
        let mut h = rms_channels(x);
        if let Some(m) = &modulation {
            h = h * (&m[1] + 1.0) + &m[0];
        }
        h = self.conv1.forward(&h.silu(), causal);
        h = rms_channels(&h);
        if let Some(m) = &modulation {
            h = h * (&m[3] + 1.0) + &m[2];
        }
        h = self.conv2.forward(&h.silu(), causal);
        let skip = match &self.shortcut {
            Some((norm, weight, bias)) => {
                let normed = norm.forward(&x.movedim([1], [-1])).movedim([-1], [1]);
                normed.conv3d(weight, Some(bias), [1; 3], [0; 3], [1; 3], 1)
            }
            None => x.shallow_clone(),
        };
        h + skip
    }
}

/// (B, C, T, H, W) → (B, C·s₀s₁s₂, T/s₀, H/s₁, W/s₂), channel `((c·s₀ + i)·s₁ + j)·s₂ + k`.
fn space_to_depth(x: &Tensor, s: [i64; 3]) -> Tensor {
    let (b, c, t, h, w) = x.size5().expect("5-d activations");
    x.reshape([b, c, t / s[0], s[0], h / s[1], s[1], w / s[2], s[2]])
        .permute([0, 1, 3, 5, 7, 2, 4, 6])
        .reshape([b, c * s[0] * s[1] * s[2], t / s[0], h / s[1], w / s[2]])
}

/// The inverse of [`space_to_depth`], then the first s₀ − 1 frames dropped.
fn depth_to_space(x: &Tensor, s: [i64; 3]) -> Tensor {
    let (b, c, t, h, w) = x.size5().expect("5-d activations");
    let n = s[0] * s[1] * s[2];
    x.reshape([b, c / n, s[0], s[1], s[2], t, h, w])
        .permute([0, 1, 5, 2, 6, 3, 7, 4])
        .reshape([b, c / n, t * s[0], h * s[1], w * s[2]])
        .narrow(2, s[0] - 1, t * s[0] - (s[0] - 1))
}

/// `LTX2VideoDownsampler3d`: the first s₀ − 1 frames repeated in front, then space-to-depth of a
/// convolution plus the group-averaged space-to-depth of the input.
pub(super) struct Downsampler {
    pub conv: CausalConv3d,
    pub stride: [i64; 3],
    pub output: i64,
}

impl Downsampler {
    pub fn forward(&self, x: &Tensor, causal: bool) -> Tensor {
        let x = if self.stride[0] > 1 {
            Tensor::cat(&[x.narrow(2, 0, self.stride[0] - 1), x.shallow_clone()], 2)
        } else {
            x.shallow_clone()
        };
        let folded = space_to_depth(&x, self.stride);
        let (b, c, t, h, w) = folded.size5().expect("5-d");
        let residual = folded.reshape([b, self.output, c / self.output, t, h, w]).mean_dim(
            2,
            false,
            folded.kind(),
        );
        space_to_depth(&self.conv.forward(&x, causal), self.stride) + residual
    }
}

/// `LTX2VideoUpsampler3d`: depth-to-space of a convolution, plus (residual) the input's
/// depth-to-space repeated over channels.
pub(super) struct Upsampler {
    pub conv: CausalConv3d,
    pub stride: [i64; 3],
    pub factor: i64,
    pub residual: bool,
}

impl Upsampler {
    pub fn forward(&self, x: &Tensor, causal: bool) -> Tensor {
        let out = depth_to_space(&self.conv.forward(x, causal), self.stride);
        if !self.residual {
            return out;
        }
        let repeats = self.stride.iter().product::<i64>() / self.factor;
        out + depth_to_space(x, self.stride).repeat([1, repeats, 1, 1, 1])
    }
}
