//! `LTX2Vocoder`'s network (a HiFi-GAN / BigVGAN generator): transposed-convolution upsamplers,
//! each followed by residual blocks run side by side and averaged, with leaky-ReLU or
//! anti-aliased Snake-β activations.

use std::f64::consts::PI;

use tch::{Device, Kind, Tensor};

use super::config::Ltx2VocoderConfig;
use crate::nn::Scope;

/// A 1-D convolution: `same` padding (as `padding="same"`: the odd one on the right) or fixed.
struct Conv1d {
    weight: Tensor,
    bias: Option<Tensor>,
    padding: Option<i64>,
    dilation: i64,
}

impl Conv1d {
    fn new(s: &Scope<'_>, input: i64, output: i64, kernel: i64, padding: Option<i64>) -> Self {
        Self::with(s, input, output, kernel, padding, 1, true)
    }

    fn with(
        s: &Scope<'_>,
        input: i64,
        output: i64,
        kernel: i64,
        padding: Option<i64>,
        dilation: i64,
        bias: bool,
    ) -> Self {
        Self {
            weight: s.var("weight", &[output, input, kernel]),
            bias: bias.then(|| s.var("bias", &[output])),
            padding,
            dilation,
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let (w, b, d) = (&self.weight, self.bias.as_ref(), [self.dilation]);
        match self.padding {
            Some(p) => x.conv1d(w, b, [1], [p], d, 1),
            None => x.conv1d_padding(w, b, [1], "same", d, 1),
        }
    }
}

/// Snake (`x + sin²(αx)/α`) or Snake-β (`x + sin²(αx)/β`), α and β stored as logarithms.
struct Snake {
    alpha: Tensor,
    beta: Option<Tensor>,
}

impl Snake {
    fn new(s: &Scope<'_>, channels: i64, beta: bool) -> Self {
        Self { alpha: s.var("alpha", &[channels]), beta: beta.then(|| s.var("beta", &[channels])) }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let alpha = self.alpha.view([1, -1, 1]).exp();
        let amplitude = match &self.beta {
            Some(beta) => beta.view([1, -1, 1]).exp(),
            None => alpha.shallow_clone(),
        };
        x + (amplitude + 1e-9).reciprocal() * (x * &alpha).sin().square()
    }
}

/// A depthwise low-pass filter `filter` (1, 1, K) that upsamples (transposed, ×ratio gain) or
/// downsamples by `ratio`, replicate-padded, cropped to ratio× (or 1/ratio×) the input length.
pub(super) struct Resample {
    filter: Tensor,
    ratio: i64,
    /// Input padding on each side (upsampling) or (left, right) (downsampling).
    pad: (i64, i64),
    /// Output cropped at each end (upsampling).
    crop: (i64, i64),
    up: bool,
}

impl Resample {
    /// BigVGAN's Kaiser-sinc upsampler (`UpSample1d`), its filter at `s/filter`.
    fn kaiser_up(s: &Scope<'_>, ratio: i64, kernel: i64) -> Self {
        let pad = kernel / ratio - 1;
        Self {
            filter: s.var("filter", &[1, 1, kernel]),
            ratio,
            pad: (pad, pad),
            crop: (pad * ratio + (kernel - ratio) / 2, pad * ratio + (kernel - ratio + 1) / 2),
            up: true,
        }
    }

    /// The Kaiser-sinc downsampler (`DownSample1d`).
    fn kaiser_down(s: &Scope<'_>, ratio: i64, kernel: i64) -> Self {
        Self {
            filter: s.var("filter", &[1, 1, kernel]),
            ratio,
            pad: (kernel / 2 + kernel % 2 - 1, kernel / 2),
            crop: (0, 0),
            up: false,
        }
    }

    /// The Hann-windowed sinc upsampler of `UpSample1d(window_type="hann")` (rolloff 0.99,
    /// 6 zero crossings), its filter computed as diffusers does (not a checkpoint buffer).
    pub fn hann_up(ratio: i64, device: Device) -> Self {
        let (rolloff, zeros): (f64, f64) = (0.99, 6.0);
        let width = (zeros / rolloff).ceil() as i64;
        let kernel = 2 * width * ratio + 1;
        let opts = (Kind::Float, Device::Cpu);
        let time = (Tensor::arange(kernel, opts) / ratio as f64 - width as f64) * rolloff;
        let window = (time.clamp(-zeros, zeros) * PI / zeros / 2.0).cos().square();
        let filter = time.sinc() * window * rolloff / ratio as f64;
        Self {
            filter: filter.view([1, 1, kernel]).to_device(device),
            ratio,
            pad: (width, width),
            crop: (2 * width * ratio, kernel - ratio),
            up: true,
        }
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        let channels = x.size()[1];
        let x = x.pad([self.pad.0, self.pad.1], "replicate", None);
        let filter = self.filter.to_kind(x.kind()).expand([channels, -1, -1], false);
        if !self.up {
            return x.conv1d(&filter, None::<Tensor>, [self.ratio], [0], [1], channels);
        }
        let y = x.conv_transpose1d(&filter, None::<Tensor>, [self.ratio], [0], [0], channels, [1])
            * self.ratio;
        let len = y.size()[2];
        y.narrow(2, self.crop.0, len - self.crop.0 - self.crop.1)
    }
}

/// An activation of the generator.
enum Act {
    Leaky(f64),
    Snake(Snake),
    /// `AntiAliasAct1d`: upsample, Snake, downsample.
    AntiAliased {
        upsample: Resample,
        act: Snake,
        downsample: Resample,
    },
}

impl Act {
    /// A block activation of `c` at `s` (Snake-β where `beta`, anti-aliased where `antialias`).
    fn new(
        s: &Scope<'_>,
        c: &Ltx2VocoderConfig,
        channels: i64,
        antialias: bool,
        beta: bool,
    ) -> Self {
        if c.act_fn == "leaky_relu" {
            return Self::Leaky(c.leaky_relu_negative_slope);
        }
        if !antialias {
            return Self::Snake(Snake::new(s, channels, beta));
        }
        let (ratio, kernel) = (c.antialias_ratio, c.antialias_kernel_size);
        Self::AntiAliased {
            upsample: Resample::kaiser_up(&(s / "upsample"), ratio, kernel),
            act: Snake::new(&(s / "act"), channels, beta),
            downsample: Resample::kaiser_down(&(s / "downsample"), ratio, kernel),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        match self {
            Self::Leaky(slope) => leaky_relu(x, *slope),
            Self::Snake(snake) => snake.forward(x),
            Self::AntiAliased { upsample, act, downsample } => {
                downsample.forward(&act.forward(&upsample.forward(x)))
            }
        }
    }
}

fn leaky_relu(x: &Tensor, slope: f64) -> Tensor {
    x.where_self(&x.gt(0.0), &(x * slope))
}

/// `ResBlock`: per dilation, act → dilated conv → act → conv, added to the input.
struct ResBlock {
    layers: Vec<[(Act, Conv1d); 2]>,
}

impl ResBlock {
    fn new(
        s: &Scope<'_>,
        c: &Ltx2VocoderConfig,
        channels: i64,
        kernel: i64,
        dilations: &[i64],
    ) -> Self {
        let layers = dilations
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                let part = |n: u8, dilation| {
                    let scope = &(s / format!("acts{n}")) / i;
                    let act = Act::new(&scope, c, channels, c.antialias, c.act_fn == "snakebeta");
                    let conv = &(s / format!("convs{n}")) / i;
                    (act, Conv1d::with(&conv, channels, channels, kernel, None, dilation, true))
                };
                [part(1, d), part(2, 1)]
            })
            .collect();
        Self { layers }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        self.layers.iter().fold(x.shallow_clone(), |x, pair| {
            let h = pair
                .iter()
                .fold(x.shallow_clone(), |h, (act, conv)| conv.forward(&act.forward(&h)));
            x + h
        })
    }
}

/// A transposed convolution upsampling by `stride` (`weight`: in × out × k).
struct Upsampler {
    weight: Tensor,
    bias: Tensor,
    stride: i64,
    padding: i64,
}

impl Upsampler {
    fn forward(&self, x: &Tensor) -> Tensor {
        x.conv_transpose1d(
            &self.weight,
            Some(&self.bias),
            [self.stride],
            [self.padding],
            [0],
            1,
            [1],
        )
    }
}

/// `LTX2Vocoder`'s modules below its scope: `conv_in`, `upsamplers`, `resnets`, `act_out`,
/// `conv_out`.
pub(super) struct Generator {
    conv_in: Conv1d,
    upsamplers: Vec<Upsampler>,
    resnets: Vec<ResBlock>,
    per_upsampler: usize,
    /// Leaky-ReLU slope before each upsampler (the leaky layout; Snake sits in the blocks).
    pre_upsample: Option<f64>,
    act_out: Act,
    conv_out: Conv1d,
    final_act: Option<String>,
}

impl Generator {
    pub fn new(s: &Scope<'_>, c: &Ltx2VocoderConfig) -> Self {
        let mut channels = c.hidden_channels;
        let mut upsamplers = vec![];
        let mut resnets = vec![];
        for (i, (&stride, &kernel)) in
            c.upsample_factors.iter().zip(&c.upsample_kernel_sizes).enumerate()
        {
            let out = channels / 2;
            let up = &(s / "upsamplers") / i;
            upsamplers.push(Upsampler {
                weight: up.var("weight", &[channels, out, kernel]),
                bias: up.var("bias", &[out]),
                stride,
                padding: (kernel - stride) / 2,
            });
            for (kernel, dilations) in c.resnet_kernel_sizes.iter().zip(&c.resnet_dilations) {
                let scope = &(s / "resnets") / resnets.len();
                resnets.push(ResBlock::new(&scope, c, out, *kernel, dilations));
            }
            channels = out;
        }
        // diffusers' output activation: leaky ReLU at torch's default slope, or an anti-aliased
        // Snake-β whatever `antialias` says.
        let act_out = match c.act_fn.as_str() {
            "leaky_relu" => Act::Leaky(0.01),
            _ => Act::new(&(s / "act_out"), c, channels, true, true),
        };
        Self {
            conv_in: Conv1d::new(&(s / "conv_in"), c.in_channels, c.hidden_channels, 7, Some(3)),
            upsamplers,
            resnets,
            per_upsampler: c.resnet_kernel_sizes.len(),
            pre_upsample: (c.act_fn == "leaky_relu").then_some(c.leaky_relu_negative_slope),
            act_out,
            conv_out: Conv1d::with(
                &(s / "conv_out"),
                channels,
                c.out_channels,
                7,
                Some(3),
                1,
                c.final_bias,
            ),
            final_act: c.final_act_fn.clone(),
        }
    }

    /// A spectrogram (B, C, frames, mel), C·mel = `in_channels`, to the waveform (B,
    /// out_channels, samples).
    pub fn forward(&self, mel: &Tensor) -> Tensor {
        let mut x = self.conv_in.forward(&mel.transpose(2, 3).flatten(1, 2));
        for (i, up) in self.upsamplers.iter().enumerate() {
            if let Some(slope) = self.pre_upsample {
                x = leaky_relu(&x, slope);
            }
            x = up.forward(&x);
            let blocks = &self.resnets[i * self.per_upsampler..(i + 1) * self.per_upsampler];
            let outs: Vec<Tensor> = blocks.iter().map(|b| b.forward(&x)).collect();
            x = Tensor::stack(&outs, 0).mean_dim(0, false, x.kind());
        }
        let x = self.conv_out.forward(&self.act_out.forward(&x));
        match self.final_act.as_deref() {
            Some("tanh") => x.tanh(),
            Some("clamp") => x.clamp(-1.0, 1.0),
            _ => x,
        }
    }
}

/// BigVGAN's Kaiser-windowed sinc low-pass filter of `kernel` taps (`kaiser_sinc_filter1d`),
/// computed in f32 as diffusers does.
pub(super) fn kaiser_sinc_filter(cutoff: f64, half_width: f64, kernel: i64) -> Tensor {
    let half = kernel / 2;
    let amplitude = 2.285 * (half - 1) as f64 * PI * 4.0 * half_width + 7.95;
    let beta = if amplitude > 50.0 {
        0.1102 * (amplitude - 8.7)
    } else if amplitude >= 21.0 {
        0.5842 * (amplitude - 21.0).powf(0.4) + 0.07886 * (amplitude - 21.0)
    } else {
        0.0
    };
    let opts = (Kind::Float, Device::Cpu);
    let window = Tensor::kaiser_window_beta(kernel, false, beta, opts);
    let time = if kernel % 2 == 0 {
        Tensor::arange_start(-half, half, opts) + 0.5
    } else {
        Tensor::arange(kernel, opts) - half as f64
    };
    let time = time * (2.0 * cutoff);
    let sinc = ((&time * PI).sin() / PI / &time).where_self(&time.ne(0.0), &time.ones_like());
    let filter = window * (2.0 * cutoff) * sinc;
    &filter / filter.sum(Kind::Float)
}

/// The (1, 1, K) Kaiser filter of every anti-aliased activation of `c` (its `upsample.filter`
/// and `downsample.filter` are the same low-pass filter).
pub(super) fn antialias_filter(c: &Ltx2VocoderConfig) -> Tensor {
    let ratio = c.antialias_ratio as f64;
    kaiser_sinc_filter(0.5 / ratio, 0.6 / ratio, c.antialias_kernel_size).view([1, 1, -1])
}
