//! Residual, attention and resampling blocks, and the encoder and decoder built from them (the
//! Wan2.1 / Qwen-Image layout, and with `is_residual` Wan2.2's residual down and up blocks).

use tch::Tensor;

use super::layers::{CausalConv3d, FrameCache, RmsNorm};
use super::residual::{ResidualDownBlock, ResidualUpBlock};
use super::VaeLayout;
use crate::nn::{attention, Conv2d, Scope};

/// (B, C, T, H, W) → (B·T, C, H, W).
pub(super) fn frames_to_batch(x: &Tensor) -> Tensor {
    let (b, c, t, h, w) = x.size5().expect("5-d (B, C, T, H, W) activations");
    x.permute([0, 2, 1, 3, 4]).reshape([b * t, c, h, w])
}

/// (B·T, C, H, W) → (B, C, T, H, W).
pub(super) fn batch_to_frames(x: &Tensor, b: i64) -> Tensor {
    let (bt, c, h, w) = x.size4().expect("4-d activations");
    x.reshape([b, bt / b, c, h, w]).permute([0, 2, 1, 3, 4])
}

/// A causal 3×3×3 convolution of the layout's kind.
fn conv3(s: &Scope<'_>, input: i64, output: i64, layout: &VaeLayout) -> CausalConv3d {
    CausalConv3d::new(s, input, output, [3; 3], [1; 3], layout.time)
}

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
struct AttentionBlock {
    norm: RmsNorm,
    to_qkv: Conv2d,
    proj: Conv2d,
}

impl AttentionBlock {
    fn new(s: &Scope<'_>, dim: i64) -> Self {
        Self {
            norm: RmsNorm::new(&(s / "norm"), dim, true),
            to_qkv: (s / "to_qkv").conv2d(dim, 3 * dim, 1, 1, 0),
            proj: (s / "proj").conv2d(dim, dim, 1, 1, 0),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
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

/// Residual block, attention, residual block.
struct MidBlock {
    resnets: [ResidualBlock; 2],
    attention: AttentionBlock,
}

impl MidBlock {
    fn new(s: &Scope<'_>, dim: i64, time: bool) -> Self {
        let r = s / "resnets";
        Self {
            resnets: [0, 1].map(|i| ResidualBlock::new(&(&r / i), dim, dim, time)),
            attention: AttentionBlock::new(&(&(s / "attentions") / 0), dim),
        }
    }

    fn forward(&self, x: &Tensor, cache: &mut FrameCache) -> Tensor {
        let x = self.resnets[0].forward(x, cache);
        self.resnets[1].forward(&self.attention.forward(&x), cache)
    }
}

/// One entry of the encoder's `down_blocks` list: Wan2.1's flat list of residual blocks,
/// attention and resamplers, or Wan2.2's residual down blocks. Attention (only with
/// `attn_scales`, which no released checkpoint sets) runs per frame without cache; diffusers 0.42
/// fails on it (it passes the cache to a block that takes none), so the reference scripts patch
/// that call.
enum DownLayer {
    Residual(ResidualBlock),
    Attention(AttentionBlock),
    Resample(Resample),
    ResidualDown(ResidualDownBlock),
}

/// `encoder`: `conv_in`, the down blocks, the mid block, `norm_out` and `conv_out`.
pub(super) struct Encoder {
    conv_in: CausalConv3d,
    down_blocks: Vec<DownLayer>,
    mid_block: MidBlock,
    norm_out: RmsNorm,
    conv_out: CausalConv3d,
}

impl Encoder {
    /// Images or video to `2·z_dim` moments (before `quant_conv`).
    pub fn new(s: &Scope<'_>, layout: &VaeLayout) -> Self {
        let dims: Vec<i64> = std::iter::once(1)
            .chain(layout.dim_mult.iter().copied())
            .map(|m| m * layout.base_dim)
            .collect();
        let levels = layout.dim_mult.len();
        let list = s / "down_blocks";
        let mut down_blocks = vec![];
        let mut scale = 1.0;
        for (i, pair) in dims.windows(2).enumerate() {
            let (mut input, output) = (pair[0], pair[1]);
            let at = |n: usize| &list / n;
            let down = (i + 1 < levels).then(|| layout.temperal_downsample[i]);
            if layout.is_residual {
                let block = ResidualDownBlock::new(
                    &at(i),
                    input,
                    output,
                    layout.num_res_blocks,
                    down,
                    layout.time,
                );
                down_blocks.push(DownLayer::ResidualDown(block));
                continue;
            }
            for _ in 0..layout.num_res_blocks {
                let block = ResidualBlock::new(&at(down_blocks.len()), input, output, layout.time);
                down_blocks.push(DownLayer::Residual(block));
                if layout.attn_scales.contains(&scale) {
                    let block = AttentionBlock::new(&at(down_blocks.len()), output);
                    down_blocks.push(DownLayer::Attention(block));
                }
                input = output;
            }
            if let Some(temporal) = down {
                let block = Resample::down(&at(down_blocks.len()), output, temporal, layout.time);
                down_blocks.push(DownLayer::Resample(block));
                scale /= 2.0;
            }
        }
        let top = *dims.last().expect("validated non-empty");
        Self {
            conv_in: conv3(&(s / "conv_in"), layout.in_channels, dims[0], layout),
            down_blocks,
            mid_block: MidBlock::new(&(s / "mid_block"), top, layout.time),
            norm_out: RmsNorm::new(&(s / "norm_out"), top, false),
            conv_out: conv3(&(s / "conv_out"), top, 2 * layout.z_dim, layout),
        }
    }

    /// One chunk of frames.
    pub fn forward(&self, x: &Tensor, cache: &mut FrameCache) -> Tensor {
        let mut x = cache.conv(&self.conv_in, x);
        for layer in &self.down_blocks {
            x = match layer {
                DownLayer::Residual(r) => r.forward(&x, cache),
                DownLayer::Attention(a) => a.forward(&x),
                DownLayer::Resample(r) => r.forward(&x, cache),
                DownLayer::ResidualDown(r) => r.forward(&x, cache),
            };
        }
        let x = self.mid_block.forward(&x, cache);
        cache.conv(&self.conv_out, &self.norm_out.forward(&x).silu())
    }
}

/// Wan2.1's up block: `num_res_blocks + 1` residual blocks, then the optional upsampler
/// (`upsamplers.0`).
struct UpBlock {
    resnets: Vec<ResidualBlock>,
    upsampler: Option<Resample>,
}

impl UpBlock {
    fn forward(&self, x: &Tensor, cache: &mut FrameCache) -> Tensor {
        let mut x = x.shallow_clone();
        for r in &self.resnets {
            x = r.forward(&x, cache);
        }
        match &self.upsampler {
            Some(up) => up.forward(&x, cache),
            None => x,
        }
    }
}

/// One entry of the decoder's `up_blocks`.
enum UpLayer {
    Plain(UpBlock),
    Residual(ResidualUpBlock),
}

/// `decoder`: `conv_in`, the mid block, the up blocks, `norm_out` and `conv_out`.
pub(super) struct Decoder {
    conv_in: CausalConv3d,
    mid_block: MidBlock,
    up_blocks: Vec<UpLayer>,
    norm_out: RmsNorm,
    conv_out: CausalConv3d,
}

impl Decoder {
    /// `z_dim` latents (after `post_quant_conv`) to pixels. `attn_scales` adds nothing here, as
    /// in diffusers.
    pub fn new(s: &Scope<'_>, layout: &VaeLayout) -> Self {
        let top = *layout.dim_mult.last().expect("validated non-empty");
        let dims: Vec<i64> = std::iter::once(top)
            .chain(layout.dim_mult.iter().rev().copied())
            .map(|m| m * layout.decoder_base_dim)
            .collect();
        let levels = layout.dim_mult.len();
        let list = s / "up_blocks";
        let up_blocks = dims
            .windows(2)
            .enumerate()
            .map(|(i, pair)| {
                let at = &list / i;
                let output = pair[1];
                // The mirror of the encoder's temporal downsampling, when this level upsamples.
                let up = (i + 1 < levels).then(|| layout.temperal_downsample[levels - 2 - i]);
                if layout.is_residual {
                    let block = ResidualUpBlock::new(
                        &at,
                        pair[0],
                        output,
                        layout.num_res_blocks,
                        up,
                        layout.time,
                    );
                    return UpLayer::Residual(block);
                }
                // Every Wan2.1 upsampler halves the width it outputs.
                let input = if i > 0 { pair[0] / 2 } else { pair[0] };
                UpLayer::Plain(UpBlock {
                    resnets: (0..=layout.num_res_blocks)
                        .map(|j| {
                            let from = if j == 0 { input } else { output };
                            ResidualBlock::new(&(&(&at / "resnets") / j), from, output, layout.time)
                        })
                        .collect(),
                    upsampler: up.map(|temporal| {
                        let at = &(&at / "upsamplers") / 0;
                        Resample::up(&at, output, output / 2, temporal, layout.time)
                    }),
                })
            })
            .collect();
        let bottom = *dims.last().expect("validated non-empty");
        Self {
            conv_in: conv3(&(s / "conv_in"), layout.z_dim, dims[0], layout),
            mid_block: MidBlock::new(&(s / "mid_block"), dims[0], layout.time),
            up_blocks,
            norm_out: RmsNorm::new(&(s / "norm_out"), bottom, false),
            conv_out: conv3(&(s / "conv_out"), bottom, layout.out_channels, layout),
        }
    }

    /// One latent frame (or chunk).
    pub fn forward(&self, x: &Tensor, cache: &mut FrameCache) -> Tensor {
        let x = cache.conv(&self.conv_in, x);
        let mut x = self.mid_block.forward(&x, cache);
        for block in &self.up_blocks {
            x = match block {
                UpLayer::Plain(b) => b.forward(&x, cache),
                UpLayer::Residual(b) => b.forward(&x, cache),
            };
        }
        cache.conv(&self.conv_out, &self.norm_out.forward(&x).silu())
    }
}
