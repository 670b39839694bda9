//! The layers of `AutoencoderKLLTX2Audio`'s encoder and decoder on spectrograms laid out (B, C,
//! time, mel): causal 2-D convolutions, pixel or group norms, residual and attention blocks, the
//! strided downsampling and nearest-neighbour upsampling.

use tch::Tensor;

use super::config::{Causality, Ltx2AudioVaeConfig};
use crate::nn::{Conv2d, GroupNorm, Scope};

/// A convolution padded so that it is causal along `causality`: F.pad's (left, right, top,
/// bottom) on (…, time, mel), the weights one level down at `conv`.
pub(super) struct CausalConv2d {
    weight: Tensor,
    bias: Tensor,
    pad: [i64; 4],
}

impl CausalConv2d {
    fn new(s: &Scope<'_>, input: i64, output: i64, kernel: i64, causality: Causality) -> Self {
        let s = s / "conv";
        let k = kernel - 1;
        let (half, rest) = (k / 2, k - k / 2);
        let pad = match causality {
            Causality::None => [half, rest, half, rest],
            Causality::Width | Causality::WidthCompatibility => [k, 0, half, rest],
            Causality::Height => [half, rest, k, 0],
        };
        Self {
            weight: s.var("weight", &[output, input, kernel, kernel]),
            bias: s.var("bias", &[output]),
            pad,
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        x.constant_pad_nd(self.pad).conv2d(
            &self.weight,
            Some(&self.bias),
            [1, 1],
            [0, 0],
            [1, 1],
            1,
        )
    }
}

/// diffusers' `LTX2AudioPixelNorm` (RMS over channels, eps 1e-6) or a 32-group norm.
enum Norm {
    Pixel,
    Group(GroupNorm),
}

impl Norm {
    fn new(s: &Scope<'_>, channels: i64, config: &Ltx2AudioVaeConfig) -> Self {
        if config.norm_type == "group" {
            Self::Group(GroupNorm::new(s, 32, channels, 1e-6))
        } else {
            Self::Pixel
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        match self {
            Self::Pixel => x / (x.square().mean_dim(1, true, x.kind()) + 1e-6).sqrt(),
            Self::Group(norm) => norm.forward(x),
        }
    }
}

/// Two norm → SiLU → conv layers and a 1×1 `nin_shortcut` when the width changes.
struct ResnetBlock {
    norm1: Norm,
    conv1: CausalConv2d,
    norm2: Norm,
    conv2: CausalConv2d,
    nin_shortcut: Option<CausalConv2d>,
}

impl ResnetBlock {
    fn new(s: &Scope<'_>, input: i64, output: i64, c: &Ltx2AudioVaeConfig) -> Self {
        let axis = c.causality();
        Self {
            norm1: Norm::new(&(s / "norm1"), input, c),
            conv1: CausalConv2d::new(&(s / "conv1"), input, output, 3, axis),
            norm2: Norm::new(&(s / "norm2"), output, c),
            conv2: CausalConv2d::new(&(s / "conv2"), output, output, 3, axis),
            nin_shortcut: (input != output)
                .then(|| CausalConv2d::new(&(s / "nin_shortcut"), input, output, 1, axis)),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let h = self.conv1.forward(&self.norm1.forward(x).silu());
        let h = self.conv2.forward(&self.norm2.forward(&h).silu());
        match &self.nin_shortcut {
            Some(shortcut) => shortcut.forward(x) + h,
            None => x + h,
        }
    }
}

/// Single-head self-attention over all (time, mel) cells with 1×1 convolutions.
struct AttnBlock {
    norm: Norm,
    q: Conv2d,
    k: Conv2d,
    v: Conv2d,
    proj_out: Conv2d,
}

impl AttnBlock {
    fn new(s: &Scope<'_>, channels: i64, c: &Ltx2AudioVaeConfig) -> Self {
        let conv = |name: &str| (s / name).conv2d(channels, channels, 1, 1, 0);
        Self {
            norm: Norm::new(&(s / "norm"), channels, c),
            q: conv("q"),
            k: conv("k"),
            v: conv("v"),
            proj_out: conv("proj_out"),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let h = self.norm.forward(x);
        let (b, c, height, width) = x.size4().expect("4-d activations");
        let flat = |t: Tensor| t.reshape([b, c, height * width]);
        let q = flat(self.q.forward(&h)).permute([0, 2, 1]);
        let k = flat(self.k.forward(&h));
        let v = flat(self.v.forward(&h));
        let weights = (q.bmm(&k) * (c as f64).powf(-0.5)).softmax(2, x.kind());
        let h = v.bmm(&weights.permute([0, 2, 1])).reshape([b, c, height, width]);
        x + self.proj_out.forward(&h)
    }
}

/// A 3×3 stride-2 convolution after padding that keeps it causal.
struct Downsample {
    conv: Conv2d,
    pad: [i64; 4],
}

impl Downsample {
    fn new(s: &Scope<'_>, channels: i64, causality: Causality) -> Self {
        let pad = match causality {
            Causality::None => [0, 1, 0, 1],
            Causality::Width => [2, 0, 0, 1],
            Causality::Height => [0, 1, 2, 0],
            Causality::WidthCompatibility => [1, 0, 0, 1],
        };
        Self { conv: (s / "conv").conv2d(channels, channels, 3, 2, 0), pad }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        self.conv.forward(&x.constant_pad_nd(self.pad))
    }
}

/// Nearest-neighbour 2× then a causal convolution, dropping the first row (time-causal) or
/// column (mel-causal) so that 2n cells become 2n − 1.
struct Upsample {
    conv: CausalConv2d,
    causality: Causality,
}

impl Upsample {
    fn new(s: &Scope<'_>, channels: i64, causality: Causality) -> Self {
        Self { conv: CausalConv2d::new(&(s / "conv"), channels, channels, 3, causality), causality }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let (_, _, h, w) = x.size4().expect("4-d activations");
        let x = x.upsample_nearest2d([2 * h, 2 * w], Some(2.0), Some(2.0));
        let x = self.conv.forward(&x);
        match self.causality {
            Causality::Height => x.narrow(2, 1, 2 * h - 1),
            Causality::Width => x.narrow(3, 1, 2 * w - 1),
            Causality::None | Causality::WidthCompatibility => x,
        }
    }
}

/// One resolution level: residual blocks, each followed by attention where the level's
/// resolution is in `attn_resolutions`, and the resampling to the next level.
struct Level<R> {
    blocks: Vec<ResnetBlock>,
    attn: Vec<AttnBlock>,
    resample: Option<R>,
}

impl<R> Level<R> {
    fn forward(&self, mut x: Tensor, resample: impl Fn(&R, &Tensor) -> Tensor) -> Tensor {
        for (i, block) in self.blocks.iter().enumerate() {
            x = block.forward(&x);
            if let Some(attn) = self.attn.get(i) {
                x = attn.forward(&x);
            }
        }
        match &self.resample {
            Some(r) => resample(r, &x),
            None => x,
        }
    }
}

/// `mid`: block, optional attention, block.
struct Mid {
    block_1: ResnetBlock,
    attn_1: Option<AttnBlock>,
    block_2: ResnetBlock,
}

impl Mid {
    fn new(s: &Scope<'_>, channels: i64, c: &Ltx2AudioVaeConfig) -> Self {
        Self {
            block_1: ResnetBlock::new(&(s / "block_1"), channels, channels, c),
            attn_1: c.mid_block_add_attention.then(|| AttnBlock::new(&(s / "attn_1"), channels, c)),
            block_2: ResnetBlock::new(&(s / "block_2"), channels, channels, c),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let x = self.block_1.forward(x);
        let x = match &self.attn_1 {
            Some(attn) => attn.forward(&x),
            None => x,
        };
        self.block_2.forward(&x)
    }
}

fn attention_at(
    s: &Scope<'_>,
    on: bool,
    n: usize,
    ch: i64,
    c: &Ltx2AudioVaeConfig,
) -> Vec<AttnBlock> {
    if on {
        (0..n).map(|i| AttnBlock::new(&(&(s / "attn") / i), ch, c)).collect()
    } else {
        vec![]
    }
}

/// The spectrogram (B, in_channels, T, mel) to the posterior moments (B, 2·latent, T', mel').
pub(super) struct Encoder {
    conv_in: CausalConv2d,
    down: Vec<Level<Downsample>>,
    mid: Mid,
    norm_out: Norm,
    conv_out: CausalConv2d,
}

impl Encoder {
    pub fn new(s: &Scope<'_>, c: &Ltx2AudioVaeConfig) -> Self {
        let axis = c.causality();
        let levels = c.ch_mult.len();
        let mut channels = c.base_channels;
        let mut resolution = c.resolution;
        let mut down = Vec::with_capacity(levels);
        for (level, mult) in c.ch_mult.iter().enumerate() {
            let s = &(s / "down") / level;
            let out = c.base_channels * mult;
            let blocks = (0..c.num_res_blocks)
                .map(|i| {
                    let block = ResnetBlock::new(&(&(&s / "block") / i), channels, out, c);
                    channels = out;
                    block
                })
                .collect();
            let attn = attention_at(&s, c.attends_at(resolution), c.num_res_blocks, out, c);
            let resample =
                (level + 1 < levels).then(|| Downsample::new(&(&s / "downsample"), out, axis));
            if level + 1 < levels {
                resolution /= 2;
            }
            down.push(Level { blocks, attn, resample });
        }
        let moments = if c.double_z { 2 * c.latent_channels } else { c.latent_channels };
        Self {
            conv_in: CausalConv2d::new(&(s / "conv_in"), c.in_channels, c.base_channels, 3, axis),
            down,
            mid: Mid::new(&(s / "mid"), channels, c),
            norm_out: Norm::new(&(s / "norm_out"), channels, c),
            conv_out: CausalConv2d::new(&(s / "conv_out"), channels, moments, 3, axis),
        }
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        let mut x = self.conv_in.forward(x);
        for level in &self.down {
            x = level.forward(x, Downsample::forward);
        }
        let x = self.mid.forward(&x);
        self.conv_out.forward(&self.norm_out.forward(&x).silu())
    }
}

/// Latents (B, latent, L, m) to the spectrogram (B, output_channels, max(4L − 3, 1), mel_bins),
/// cropped or zero-padded to that as diffusers does.
pub(super) struct Decoder {
    conv_in: CausalConv2d,
    mid: Mid,
    /// Indexed by level, run from the last.
    up: Vec<Level<Upsample>>,
    norm_out: Norm,
    conv_out: CausalConv2d,
    output_channels: i64,
    mel_bins: i64,
}

impl Decoder {
    pub fn new(s: &Scope<'_>, c: &Ltx2AudioVaeConfig) -> Self {
        let axis = c.causality();
        let levels = c.ch_mult.len();
        let top = c.base_channels * c.ch_mult[levels - 1];
        let mut channels = top;
        let mut resolution = c.resolution >> (levels - 1);
        let mut up: Vec<Level<Upsample>> = Vec::with_capacity(levels);
        for level in (0..levels).rev() {
            let s = &(s / "up") / level;
            let out = c.base_channels * c.ch_mult[level];
            let n = c.num_res_blocks + 1;
            let blocks = (0..n)
                .map(|i| {
                    let block = ResnetBlock::new(&(&(&s / "block") / i), channels, out, c);
                    channels = out;
                    block
                })
                .collect();
            let attn = attention_at(&s, c.attends_at(resolution), n, out, c);
            let resample = (level != 0).then(|| Upsample::new(&(&s / "upsample"), out, axis));
            if level != 0 {
                resolution *= 2;
            }
            up.insert(0, Level { blocks, attn, resample });
        }
        Self {
            conv_in: CausalConv2d::new(&(s / "conv_in"), c.latent_channels, top, 3, axis),
            mid: Mid::new(&(s / "mid"), top, c),
            up,
            norm_out: Norm::new(&(s / "norm_out"), channels, c),
            conv_out: CausalConv2d::new(&(s / "conv_out"), channels, c.output_channels, 3, axis),
            output_channels: c.output_channels,
            mel_bins: c.mel(),
        }
    }

    pub fn forward(&self, z: &Tensor) -> Tensor {
        let frames = z.size()[2];
        let target_time = (frames * super::COMPRESSION - (super::COMPRESSION - 1)).max(1);
        let target_mel = self.mel_bins;
        let mut x = self.mid.forward(&self.conv_in.forward(z));
        for level in self.up.iter().rev() {
            x = level.forward(x, Upsample::forward);
        }
        let x = self.conv_out.forward(&self.norm_out.forward(&x).silu());
        let (_, _, time, freq) = x.size4().expect("4-d output");
        let x = x.narrow(1, 0, self.output_channels).narrow(2, 0, time.min(target_time)).narrow(
            3,
            0,
            freq.min(target_mel),
        );
        let (pad_time, pad_mel) = ((target_time - time).max(0), (target_mel - freq).max(0));
        if pad_time > 0 || pad_mel > 0 {
            x.constant_pad_nd([0, pad_mel, 0, pad_time])
        } else {
            x
        }
    }
}
