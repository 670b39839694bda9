//! Residual, attention and resampling blocks of the Wan-style VAEs.

use tch::Tensor;

use super::layers::{batch_to_frames, frames_to_batch, CausalConv3d, FrameCache, RmsNorm};
use crate::nn::{attention, Conv2d, Scope};

/// Two causal 3×3×3 convolutions after RMS norm and SiLU, plus the (1×1×1 where the width
/// changes) shortcut.
pub(super) struct ResidualBlock {
    norm1: RmsNorm,
    conv1: CausalConv3d,
    norm2: RmsNorm,
    conv2: CausalConv3d,
    conv_shortcut: Option<CausalConv3d>,
}

impl ResidualBlock {
    /// The block below `s` from `input` to `output` channels (`time`: see [`CausalConv3d`]).
    pub fn new(s: &Scope<'_>, input: i64, output: i64, time: bool) -> Self {
        let conv = |name: &str, input: i64, k: i64| {
            CausalConv3d::new(&(s / name), input, output, [k; 3], [1; 3], time)
        };
        Self {
            norm1: RmsNorm::new(&(s / "norm1"), input, false),
            conv1: conv("conv1", input, 3),
            norm2: RmsNorm::new(&(s / "norm2"), output, false),
            conv2: conv("conv2", output, 3),
            conv_shortcut: (input != output).then(|| conv("conv_shortcut", input, 1)),
        }
    }

    /// One chunk of frames, each convolution continuing from its cached history.
    pub fn forward(&self, x: &Tensor, cache: &mut FrameCache) -> Tensor {
        let h = cache.conv(&self.conv1, &self.norm1.forward(x).silu());
        let h = cache.conv(&self.conv2, &self.norm2.forward(&h).silu());
        match &self.conv_shortcut {
            Some(c) => h + c.forward(x, None),
            None => h + x,
        }
    }
}

/// Single-head spatial self-attention within each frame, with residual.
pub(super) struct AttentionBlock {
    norm: RmsNorm,
    to_qkv: Conv2d,
    proj: Conv2d,
}

impl AttentionBlock {
    pub fn new(s: &Scope<'_>, dim: i64) -> Self {
        Self {
            norm: RmsNorm::new(&(s / "norm"), dim, true),
            to_qkv: (s / "to_qkv").conv2d(dim, 3 * dim, 1, 1, 0),
            proj: (s / "proj").conv2d(dim, dim, 1, 1, 0),
        }
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        let (b, c, _, h, w) = x.size5().expect("5-d activations");
        let frames = frames_to_batch(x);
        let bt = frames.size()[0];
        let qkv = self.to_qkv.forward(&self.norm.forward(&frames));
        let qkv = qkv.reshape([bt, 1, 3 * c, h * w]).transpose(2, 3);
        let [q, k, v]: [Tensor; 3] = qkv.chunk(3, -1).try_into().expect("three chunks");
        let out = attention(&q, &k, &v, None, false, None);
        let out = out.squeeze_dim(1).transpose(1, 2).reshape([bt, c, h, w]);
        batch_to_frames(&self.proj.forward(&out), b) + x
    }
}

/// Spatial ×2 resampling of each frame (`resample.1`), and with `time_conv` also in time: the
/// decoder doubles every frame after the first chunk's, the encoder halves the frames after it
/// (stride 2 over the previous chunk's last frame and this chunk's).
pub(super) struct Resample {
    conv: Conv2d,
    time_conv: Option<CausalConv3d>,
    up: bool,
}

impl Resample {
    /// A downsampler of `dim` channels.
    pub fn down(s: &Scope<'_>, dim: i64, temporal: bool, time: bool) -> Self {
        Self::new(s, dim, dim, false, temporal, time)
    }

    /// An upsampler from `dim` to `output` channels (`dim / 2` in Wan2.1's decoder).
    pub fn up(s: &Scope<'_>, dim: i64, output: i64, temporal: bool, time: bool) -> Self {
        Self::new(s, dim, output, true, temporal, time)
    }

    /// `time`: see [`CausalConv3d`]; without it the time convolutions are 1×1 and never run on
    /// pictures (the first chunk passes them by).
    fn new(s: &Scope<'_>, dim: i64, output: i64, up: bool, temporal: bool, time: bool) -> Self {
        let kt = if time { 3 } else { 1 };
        let conv = &(s / "resample") / 1;
        let time_conv = s / "time_conv";
        if up {
            Self {
                conv: conv.conv2d(dim, output, 3, 1, 1),
                time_conv: temporal
                    .then(|| CausalConv3d::new(&time_conv, dim, 2 * dim, [kt, 1, 1], [1; 3], time)),
                up,
            }
        } else {
            Self {
                conv: conv.conv2d(dim, dim, 3, 2, 0),
                time_conv: temporal.then(|| {
                    let stride = [2, 1, 1];
                    CausalConv3d::with_padding(
                        &time_conv,
                        dim,
                        dim,
                        [kt, 1, 1],
                        stride,
                        [0; 3],
                        time,
                    )
                }),
                up,
            }
        }
    }

    /// One chunk of frames (the temporal step passes the first chunk through).
    pub fn forward(&self, x: &Tensor, cache: &mut FrameCache) -> Tensor {
        let (b, c, t, h, w) = x.size5().expect("5-d activations");
        let mut x = x.shallow_clone();
        if let (true, Some(time_conv)) = (self.up, &self.time_conv) {
            if cache.first_chunk() {
                cache.take();
            } else {
                // Channels (2, C) become frame pairs (T, 2).
                x = cache.conv(time_conv, &x).reshape([b, 2, c, t, h, w]);
                x = x.permute([0, 2, 3, 1, 4, 5]).reshape([b, c, 2 * t, h, w]);
            }
        }
        let frames = frames_to_batch(&x);
        let frames = if self.up {
            let (_, _, h, w) = frames.size4().expect("4-d frames");
            frames.internal_upsample_nearest_exact2d([2 * h, 2 * w], 2.0, 2.0)
        } else {
            frames.constant_pad_nd([0, 1, 0, 1])
        };
        let x = batch_to_frames(&self.conv.forward(&frames), b);
        match (self.up, &self.time_conv) {
            (false, Some(time_conv)) => {
                let (slot, history) = cache.take();
                cache.put(slot, history.as_ref(), &x, 1);
                match history {
                    Some(last) => time_conv.forward(&Tensor::cat(&[&last, &x], 2), None),
                    None => x,
                }
            }
            _ => x,
        }
    }
}
