//! `LTX2VocoderWithBWE`'s bandwidth extension: the first stage's waveform, padded to whole hops,
//! becomes a causal log-mel spectrogram (STFT and mel bases read from the checkpoint), from which
//! a second generator predicts a residual added to the Hann-sinc-resampled waveform.

use std::f64::consts::PI;

use tch::Tensor;

use super::config::Ltx2VocoderBweConfig;
use super::generator::{Generator, Resample};
use crate::nn::Scope;

/// `MelSTFT`: `stft_fn.forward_basis` (2F, 1, filter_length) (real then imaginary DFT rows,
/// windowed), `stft_fn.inverse_basis` (kept, unused) and `mel_basis` (mels, F).
struct MelStft {
    forward_basis: Tensor,
    mel_basis: Tensor,
    hop: i64,
    left_pad: i64,
}

impl MelStft {
    fn new(s: &Scope<'_>, c: &Ltx2VocoderBweConfig) -> Self {
        let stft = s / "stft_fn";
        let freqs = c.filter_length / 2 + 1;
        let basis = [2 * freqs, 1, c.filter_length];
        let _inverse = stft.var("inverse_basis", &basis);
        Self {
            forward_basis: stft.var("forward_basis", &basis),
            mel_basis: s.var("mel_basis", &[c.num_mel_channels, freqs]),
            hop: c.hop_length,
            left_pad: (c.window_length - c.hop_length).max(0),
        }
    }

    /// Waveforms (N, samples) to log-mel spectrograms (N, mels, frames).
    fn forward(&self, waveform: &Tensor) -> Tensor {
        let x = waveform.unsqueeze(1).constant_pad_nd([self.left_pad, 0]);
        let spec = x.conv1d(&self.forward_basis, None::<Tensor>, [self.hop], [0], [1], 1);
        let freqs = spec.size()[1] / 2;
        let (real, imag) = (spec.narrow(1, 0, freqs), spec.narrow(1, freqs, freqs));
        let magnitude = (real.square() + imag.square()).sqrt();
        let mel = self.mel_basis.to_kind(magnitude.kind()).matmul(&magnitude);
        mel.clamp_min(1e-5).log()
    }
}

/// The two generators, the mel STFT between them and the resampler of the skip path.
pub(super) struct Bwe {
    vocoder: Generator,
    bwe_generator: Generator,
    mel_stft: MelStft,
    resampler: Resample,
    hop: i64,
    ratio: i64,
}

impl Bwe {
    pub fn new(s: &Scope<'_>, c: &Ltx2VocoderBweConfig) -> Self {
        Self {
            vocoder: Generator::new(&(s / "vocoder"), &c.stage1()),
            bwe_generator: Generator::new(&(s / "bwe_generator"), &c.extender()),
            mel_stft: MelStft::new(&(s / "mel_stft"), c),
            resampler: Resample::hann_up(c.ratio(), s.path.device()),
            hop: c.hop_length,
            ratio: c.ratio(),
        }
    }

    /// A spectrogram (B, C, frames, mel) to the waveform (B, out_channels, ratio × the first
    /// stage's samples), in [−1, 1].
    pub fn forward(&self, mel: &Tensor) -> Tensor {
        let x = self.vocoder.forward(mel);
        let (b, channels, samples) = x.size3().expect("3-d waveform");
        let rest = samples % self.hop;
        let x = if rest == 0 { x } else { x.constant_pad_nd([0, self.hop - rest]) };
        let mel = self.mel_stft.forward(&x.flatten(0, 1));
        let mel = mel.unflatten(0, [b, channels]).transpose(2, 3);
        let residual = self.bwe_generator.forward(&mel);
        let waveform = (residual + self.resampler.forward(&x)).clamp(-1.0, 1.0);
        waveform.narrow(2, 0, samples * self.ratio)
    }
}

/// A windowed DFT basis for a random checkpoint: rows `cos(2πkn/L)·w(n)` then `−sin(2πkn/L)·w(n)`
/// for k ≤ L/2, w the periodic Hann window of `window` taps centred in `length`; the inverse basis
/// is the same over L.
pub(super) fn stft_bases(length: i64, window: i64) -> (Tensor, Tensor) {
    let freqs = length / 2 + 1;
    let offset = (length - window) / 2;
    let mut values = vec![0f32; (2 * freqs * length) as usize];
    for k in 0..freqs {
        for n in 0..length {
            let i = n - offset;
            let w = if (0..window).contains(&i) {
                0.5 - 0.5 * (2.0 * PI * i as f64 / window as f64).cos()
            } else {
                0.0
            };
            let angle = 2.0 * PI * (k * n) as f64 / length as f64;
            values[(k * length + n) as usize] = (angle.cos() * w) as f32;
            values[((freqs + k) * length + n) as usize] = (-angle.sin() * w) as f32;
        }
    }
    let forward = Tensor::from_slice(&values).view([2 * freqs, 1, length]);
    let inverse = &forward / length as f64;
    (forward, inverse)
}

/// Triangular filters on the HTK mel scale from 0 Hz to `sample_rate / 2` over `freqs` DFT bins
/// (mels, freqs), for a random checkpoint.
pub(super) fn mel_filterbank(mels: i64, freqs: i64, sample_rate: i64) -> Tensor {
    let to_mel = |f: f64| 2595.0 * (1.0 + f / 700.0).log10();
    let to_hz = |m: f64| 700.0 * (10f64.powf(m / 2595.0) - 1.0);
    let top = to_mel(sample_rate as f64 / 2.0);
    let edges: Vec<f64> =
        (0..mels + 2).map(|i| to_hz(top * i as f64 / (mels + 1) as f64)).collect();
    let bin_hz = sample_rate as f64 / 2.0 / (freqs - 1).max(1) as f64;
    let mut values = vec![0f32; (mels * freqs) as usize];
    for m in 0..mels as usize {
        let (lo, mid, hi) = (edges[m], edges[m + 1], edges[m + 2]);
        for f in 0..freqs as usize {
            let hz = f as f64 * bin_hz;
            let up = (hz - lo) / (mid - lo);
            let down = (hi - hz) / (hi - mid);
            values[m * freqs as usize + f] = up.min(down).max(0.0) as f32;
        }
    }
    Tensor::from_slice(&values).view([mels, freqs])
}
