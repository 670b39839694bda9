//! The encoder and decoder built from the blocks (the Wan2.1 / Qwen-Image layout, and with
//! `is_residual` Wan2.2's residual down and up blocks).

use tch::Tensor;

use super::blocks::{AttentionBlock, Resample, ResidualBlock};
use super::layers::{CausalConv3d, FrameCache, RmsNorm};
use super::residual::{ResidualDownBlock, ResidualUpBlock};
use super::VaeLayout;
use crate::nn::Scope;

/// A causal 3×3×3 convolution of the layout's kind.
fn conv3(s: &Scope<'_>, input: i64, output: i64, layout: &VaeLayout) -> CausalConv3d {
    CausalConv3d::new(s, input, output, [3; 3], [1; 3], layout.time)
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
