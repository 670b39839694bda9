//! Mirrors of `vocoder/config.json`: `LTX2Vocoder` (LTX-2) and `LTX2VocoderWithBWE` (LTX-2.3),
//! told apart by `_class_name`.

use serde::{Deserialize, Serialize};

/// `LTX2Vocoder` config, with diffusers' field names and defaults (LTX-2's: 128 = 2 × 64 mel
/// inputs, 240× upsampling to 24 kHz stereo, leaky ReLU, tanh output).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Ltx2VocoderConfig {
    /// Spectrogram channels × mel bins.
    pub in_channels: i64,
    /// Width after `conv_in`; halved by each upsampler.
    pub hidden_channels: i64,
    /// Waveform channels.
    pub out_channels: i64,
    pub upsample_kernel_sizes: Vec<i64>,
    /// Samples per frame added by each upsampler (their product: samples per spectrogram frame).
    pub upsample_factors: Vec<i64>,
    /// Kernel of each residual block run after every upsampler.
    pub resnet_kernel_sizes: Vec<i64>,
    pub resnet_dilations: Vec<Vec<i64>>,
    /// `leaky_relu`, `snake` or `snakebeta`.
    pub act_fn: String,
    pub leaky_relu_negative_slope: f64,
    /// Snake activations run at `antialias_ratio`× the rate between Kaiser-sinc filters of
    /// `antialias_kernel_size` taps (not with leaky ReLU).
    pub antialias: bool,
    pub antialias_ratio: i64,
    pub antialias_kernel_size: i64,
    /// `tanh`, `clamp` (to [−1, 1]) or null.
    pub final_act_fn: Option<String>,
    pub final_bias: bool,
    pub output_sampling_rate: i64,
}

impl Default for Ltx2VocoderConfig {
    fn default() -> Self {
        Self {
            in_channels: 128,
            hidden_channels: 1024,
            out_channels: 2,
            upsample_kernel_sizes: vec![16, 15, 8, 4, 4],
            upsample_factors: vec![6, 5, 2, 2, 2],
            resnet_kernel_sizes: vec![3, 7, 11],
            resnet_dilations: vec![vec![1, 3, 5]; 3],
            act_fn: "leaky_relu".into(),
            leaky_relu_negative_slope: 0.1,
            antialias: false,
            antialias_ratio: 2,
            antialias_kernel_size: 12,
            final_act_fn: Some("tanh".into()),
            final_bias: true,
            output_sampling_rate: 24000,
        }
    }
}

impl Ltx2VocoderConfig {
    /// A tiny random-weight layout of LTX-2's (for `make-tiny ltx2` and tests): 2 × 16 mel
    /// inputs, width 32, 8× upsampling.
    pub fn tiny() -> Self {
        Self {
            in_channels: 32,
            hidden_channels: 32,
            upsample_kernel_sizes: vec![8, 4],
            upsample_factors: vec![4, 2],
            resnet_kernel_sizes: vec![3, 5],
            resnet_dilations: vec![vec![1, 3], vec![1, 2]],
            ..Self::default()
        }
    }

    /// Waveform samples per spectrogram frame.
    pub fn upsampling(&self) -> i64 {
        self.upsample_factors.iter().product()
    }

    /// Samples decoded from `frames` spectrogram frames.
    pub fn samples(&self, frames: i64) -> i64 {
        let layers = self.upsample_factors.iter().zip(&self.upsample_kernel_sizes);
        layers.fold(frames, |n, (&s, &k)| (n - 1) * s - 2 * ((k - s) / 2) + k)
    }

    /// Checks what diffusers would reject or silently misbuild; keys are named with `prefix`
    /// (`bwe_` for the bandwidth extender's).
    pub fn validate(&self, prefix: &str) -> Result<(), String> {
        let n = self.upsample_factors.len();
        if n == 0 || self.upsample_kernel_sizes.len() != n {
            return Err(format!(
                "{prefix}upsample_kernel_sizes ({}) and {prefix}upsample_factors ({n}) must be \
                 non-empty lists of the same length",
                self.upsample_kernel_sizes.len()
            ));
        }
        if let Some((s, k)) = (self.upsample_factors.iter().zip(&self.upsample_kernel_sizes))
            .find(|(&s, &k)| s <= 0 || k < s)
        {
            return Err(format!(
                "{prefix}upsample_factors / {prefix}upsample_kernel_sizes: factor {s} with \
                 kernel {k} (factors positive, kernels at least the factor)"
            ));
        }
        if self.resnet_kernel_sizes.is_empty()
            || self.resnet_kernel_sizes.len() != self.resnet_dilations.len()
        {
            return Err(format!(
                "{prefix}resnet_kernel_sizes ({}) and {prefix}resnet_dilations ({}) must be \
                 non-empty lists of the same length",
                self.resnet_kernel_sizes.len(),
                self.resnet_dilations.len()
            ));
        }
        let bad = |v: &i64| *v <= 0;
        if self.resnet_kernel_sizes.iter().any(bad)
            || self.resnet_dilations.iter().any(|d| d.is_empty() || d.iter().any(bad))
        {
            return Err(format!(
                "{prefix}resnet_kernel_sizes and {prefix}resnet_dilations must be positive \
                 (each block at least one dilation)"
            ));
        }
        for (key, value) in [
            ("in_channels", self.in_channels),
            ("out_channels", self.out_channels),
            ("antialias_ratio", self.antialias_ratio),
            ("antialias_kernel_size", self.antialias_kernel_size),
            ("output_sampling_rate", self.output_sampling_rate),
        ] {
            if value <= 0 {
                return Err(format!("{prefix}{key} must be positive, not {value}"));
            }
        }
        if self.hidden_channels >> n == 0 || self.hidden_channels % (1 << n) != 0 {
            return Err(format!(
                "{prefix}hidden_channels {} is halved by each of the {n} upsamplers: it must be \
                 a multiple of {}",
                self.hidden_channels,
                1 << n
            ));
        }
        match self.act_fn.as_str() {
            "snake" | "snakebeta" => {}
            "leaky_relu" if self.antialias => {
                return Err(format!(
                    "{prefix}antialias with {prefix}act_fn leaky_relu is refused (diffusers \
                     nests the second activations' filters)"
                ))
            }
            "leaky_relu" => {}
            other => {
                return Err(format!(
                    "{prefix}act_fn {other:?} is not snakebeta, snake or leaky_relu"
                ))
            }
        }
        match self.final_act_fn.as_deref() {
            None | Some("tanh") | Some("clamp") => Ok(()),
            Some(other) => {
                Err(format!("{prefix}final_act_fn {other:?} is not tanh, clamp or null"))
            }
        }
    }
}

/// `LTX2VocoderWithBWE` config, with diffusers' field names and defaults (LTX-2.3's: a 16 kHz
/// vocoder, the log-mel spectrogram of its output, and a bandwidth extender adding to the 3×
/// resampled waveform at 48 kHz).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Ltx2VocoderBweConfig {
    pub in_channels: i64,
    pub hidden_channels: i64,
    pub out_channels: i64,
    pub upsample_kernel_sizes: Vec<i64>,
    pub upsample_factors: Vec<i64>,
    pub resnet_kernel_sizes: Vec<i64>,
    pub resnet_dilations: Vec<Vec<i64>>,
    pub act_fn: String,
    pub leaky_relu_negative_slope: f64,
    pub antialias: bool,
    pub antialias_ratio: i64,
    pub antialias_kernel_size: i64,
    pub final_act_fn: Option<String>,
    pub final_bias: bool,
    /// The bandwidth extender's generator: inputs `out_channels × num_mel_channels`.
    pub bwe_in_channels: i64,
    pub bwe_hidden_channels: i64,
    pub bwe_out_channels: i64,
    pub bwe_upsample_kernel_sizes: Vec<i64>,
    pub bwe_upsample_factors: Vec<i64>,
    pub bwe_resnet_kernel_sizes: Vec<i64>,
    pub bwe_resnet_dilations: Vec<Vec<i64>>,
    pub bwe_act_fn: String,
    pub bwe_leaky_relu_negative_slope: f64,
    pub bwe_antialias: bool,
    pub bwe_antialias_ratio: i64,
    pub bwe_antialias_kernel_size: i64,
    pub bwe_final_act_fn: Option<String>,
    pub bwe_final_bias: bool,
    /// The causal STFT of the first stage's waveform: DFT size, hop and window.
    pub filter_length: i64,
    pub hop_length: i64,
    pub window_length: i64,
    pub num_mel_channels: i64,
    /// The first stage's rate and the output's (an integer multiple of it).
    pub input_sampling_rate: i64,
    pub output_sampling_rate: i64,
}

impl Default for Ltx2VocoderBweConfig {
    fn default() -> Self {
        let dilations = vec![vec![1, 3, 5]; 3];
        Self {
            in_channels: 128,
            hidden_channels: 1536,
            out_channels: 2,
            upsample_kernel_sizes: vec![11, 4, 4, 4, 4, 4],
            upsample_factors: vec![5, 2, 2, 2, 2, 2],
            resnet_kernel_sizes: vec![3, 7, 11],
            resnet_dilations: dilations.clone(),
            act_fn: "snakebeta".into(),
            leaky_relu_negative_slope: 0.1,
            antialias: true,
            antialias_ratio: 2,
            antialias_kernel_size: 12,
            final_act_fn: None,
            final_bias: false,
            bwe_in_channels: 128,
            bwe_hidden_channels: 512,
            bwe_out_channels: 2,
            bwe_upsample_kernel_sizes: vec![12, 11, 4, 4, 4],
            bwe_upsample_factors: vec![6, 5, 2, 2, 2],
            bwe_resnet_kernel_sizes: vec![3, 7, 11],
            bwe_resnet_dilations: dilations,
            bwe_act_fn: "snakebeta".into(),
            bwe_leaky_relu_negative_slope: 0.1,
            bwe_antialias: true,
            bwe_antialias_ratio: 2,
            bwe_antialias_kernel_size: 12,
            bwe_final_act_fn: None,
            bwe_final_bias: false,
            filter_length: 512,
            hop_length: 80,
            window_length: 512,
            num_mel_channels: 64,
            input_sampling_rate: 16000,
            output_sampling_rate: 48000,
        }
    }
}

impl Ltx2VocoderBweConfig {
    /// A tiny random-weight layout of LTX-2.3's: a 2 × 16-mel, 8× first stage; STFT of 32 with
    /// hop 6 (so the first stage's output is padded), 8 mel channels; an 18× extender for 3×.
    pub fn tiny() -> Self {
        Self {
            in_channels: 32,
            hidden_channels: 32,
            upsample_kernel_sizes: vec![8, 4],
            upsample_factors: vec![4, 2],
            resnet_kernel_sizes: vec![3, 5],
            resnet_dilations: vec![vec![1, 3], vec![1, 2]],
            bwe_in_channels: 16,
            bwe_hidden_channels: 32,
            bwe_upsample_kernel_sizes: vec![9, 7, 4],
            bwe_upsample_factors: vec![3, 3, 2],
            bwe_resnet_kernel_sizes: vec![3],
            bwe_resnet_dilations: vec![vec![1, 2]],
            filter_length: 32,
            hop_length: 6,
            window_length: 32,
            num_mel_channels: 8,
            ..Self::default()
        }
    }

    /// The first stage (`vocoder`), at `input_sampling_rate`.
    pub fn stage1(&self) -> Ltx2VocoderConfig {
        Ltx2VocoderConfig {
            in_channels: self.in_channels,
            hidden_channels: self.hidden_channels,
            out_channels: self.out_channels,
            upsample_kernel_sizes: self.upsample_kernel_sizes.clone(),
            upsample_factors: self.upsample_factors.clone(),
            resnet_kernel_sizes: self.resnet_kernel_sizes.clone(),
            resnet_dilations: self.resnet_dilations.clone(),
            act_fn: self.act_fn.clone(),
            leaky_relu_negative_slope: self.leaky_relu_negative_slope,
            antialias: self.antialias,
            antialias_ratio: self.antialias_ratio,
            antialias_kernel_size: self.antialias_kernel_size,
            final_act_fn: self.final_act_fn.clone(),
            final_bias: self.final_bias,
            output_sampling_rate: self.input_sampling_rate,
        }
    }

    /// The bandwidth extender (`bwe_generator`), at `output_sampling_rate`.
    pub fn extender(&self) -> Ltx2VocoderConfig {
        Ltx2VocoderConfig {
            in_channels: self.bwe_in_channels,
            hidden_channels: self.bwe_hidden_channels,
            out_channels: self.bwe_out_channels,
            upsample_kernel_sizes: self.bwe_upsample_kernel_sizes.clone(),
            upsample_factors: self.bwe_upsample_factors.clone(),
            resnet_kernel_sizes: self.bwe_resnet_kernel_sizes.clone(),
            resnet_dilations: self.bwe_resnet_dilations.clone(),
            act_fn: self.bwe_act_fn.clone(),
            leaky_relu_negative_slope: self.bwe_leaky_relu_negative_slope,
            antialias: self.bwe_antialias,
            antialias_ratio: self.bwe_antialias_ratio,
            antialias_kernel_size: self.bwe_antialias_kernel_size,
            final_act_fn: self.bwe_final_act_fn.clone(),
            final_bias: self.bwe_final_bias,
            output_sampling_rate: self.output_sampling_rate,
        }
    }

    /// Output samples per first-stage sample.
    pub fn ratio(&self) -> i64 {
        self.output_sampling_rate / self.input_sampling_rate
    }

    /// Checks both generators and that the extender's output lines up with the resampled
    /// first stage (as diffusers' sum needs).
    pub fn validate(&self) -> Result<(), String> {
        self.stage1().validate("")?;
        self.extender().validate("bwe_")?;
        for (key, value) in [
            ("filter_length", self.filter_length),
            ("hop_length", self.hop_length),
            ("window_length", self.window_length),
            ("num_mel_channels", self.num_mel_channels),
            ("input_sampling_rate", self.input_sampling_rate),
        ] {
            if value <= 0 {
                return Err(format!("{key} must be positive, not {value}"));
            }
        }
        if self.window_length != self.filter_length {
            return Err(format!(
                "window_length {} must equal filter_length {}: otherwise the causal STFT's \
                 frames do not line up with hop_length",
                self.window_length, self.filter_length
            ));
        }
        if self.output_sampling_rate % self.input_sampling_rate != 0 {
            return Err(format!(
                "output_sampling_rate {} must be a multiple of input_sampling_rate {}",
                self.output_sampling_rate, self.input_sampling_rate
            ));
        }
        if self.bwe_in_channels != self.out_channels * self.num_mel_channels {
            return Err(format!(
                "bwe_in_channels {} must be out_channels {} × num_mel_channels {}",
                self.bwe_in_channels, self.out_channels, self.num_mel_channels
            ));
        }
        if self.bwe_out_channels != self.out_channels {
            return Err(format!(
                "bwe_out_channels {} must equal out_channels {} (the extender adds to the \
                 resampled waveform)",
                self.bwe_out_channels, self.out_channels
            ));
        }
        let extender = self.extender();
        if extender.samples(4) != 4 * self.hop_length * self.ratio() {
            return Err(format!(
                "bwe_upsample_factors {:?} (kernels {:?}) must turn each STFT frame of \
                 hop_length {} into hop_length × {} samples",
                self.bwe_upsample_factors,
                self.bwe_upsample_kernel_sizes,
                self.hop_length,
                self.ratio()
            ));
        }
        Ok(())
    }
}

/// A `vocoder/config.json`, by `_class_name`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "_class_name")]
pub enum Ltx2VocoderClass {
    #[serde(rename = "LTX2Vocoder")]
    Plain(Ltx2VocoderConfig),
    #[serde(rename = "LTX2VocoderWithBWE")]
    WithBwe(Box<Ltx2VocoderBweConfig>),
}

impl Ltx2VocoderClass {
    /// Checks the settings; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            Self::Plain(c) => c.validate(""),
            Self::WithBwe(c) => c.validate(),
        }
    }

    /// diffusers' class name.
    pub fn class_name(&self) -> &'static str {
        match self {
            Self::Plain(_) => "LTX2Vocoder",
            Self::WithBwe(_) => "LTX2VocoderWithBWE",
        }
    }

    /// The waveform's sample rate (`output_sampling_rate`).
    pub fn output_sampling_rate(&self) -> i64 {
        match self {
            Self::Plain(c) => c.output_sampling_rate,
            Self::WithBwe(c) => c.output_sampling_rate,
        }
    }

    /// Spectrogram channels × mel bins the vocoder reads.
    pub fn in_channels(&self) -> i64 {
        match self {
            Self::Plain(c) => c.in_channels,
            Self::WithBwe(c) => c.in_channels,
        }
    }

    /// Waveform samples (per channel) of `frames` spectrogram frames.
    pub fn samples(&self, frames: i64) -> i64 {
        match self {
            Self::Plain(c) => c.samples(frames),
            Self::WithBwe(c) => c.stage1().samples(frames) * c.ratio(),
        }
    }
}
