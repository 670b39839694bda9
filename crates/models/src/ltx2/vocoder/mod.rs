//! LTX-2's vocoders, mel spectrogram (B, channels, frames, mel) → waveform (B, channels,
//! samples), as `vocoder(mel)` in LTX2Pipeline: `LTX2Vocoder` (LTX-2: one generator, 24 kHz) and
//! `LTX2VocoderWithBWE` (LTX-2.3: a 16 kHz generator and a bandwidth extender to 48 kHz), chosen
//! by the folder's `_class_name`.
//!
//! The Kaiser-sinc filters of the anti-aliased activations and the BWE's STFT and mel bases are
//! checkpoint buffers and are read from it; the BWE's Hann-sinc resampler is computed.

mod bwe;
mod config;
mod generator;

use std::path::Path;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::audio_vae::write_component;
use crate::nn::Scope;
use crate::weights::{checkpoint_files, load_weights, LoadOptions};
use crate::{read_config, ModelError};
use bwe::Bwe;
pub use config::{Ltx2VocoderBweConfig, Ltx2VocoderClass, Ltx2VocoderConfig};
use generator::Generator;

enum Net {
    Plain(Box<Generator>),
    WithBwe(Box<Bwe>),
}

/// A vocoder and its weights at the store's root, named like diffusers' checkpoint keys.
pub struct Ltx2Vocoder {
    pub config: Ltx2VocoderClass,
    net: Net,
    pub store: VarStore,
}

impl Ltx2Vocoder {
    /// The module tree of `config` for `kind` weights, unfilled.
    pub fn new(config: &Ltx2VocoderClass, device: Device, kind: Kind) -> Result<Self, ModelError> {
        config.validate().map_err(ModelError::Input)?;
        let store = crate::weights::store(device, kind);
        let root = Scope::root(store.root(), None);
        let net = match config {
            Ltx2VocoderClass::Plain(c) => Net::Plain(Box::new(Generator::new(&root, c))),
            Ltx2VocoderClass::WithBwe(c) => Net::WithBwe(Box::new(Bwe::new(&root, c))),
        };
        Ok(Self { config: config.clone(), net, store })
    }

    /// Loads a diffusers `vocoder/` directory, frozen.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let path = dir.join("config.json");
        let config: Ltx2VocoderClass = read_config(&path)?;
        config
            .validate()
            .map_err(|message| ModelError::Format { path: path.display().to_string(), message })?;
        let mut vocoder = Self::new(&config, device, kind)?;
        let options = LoadOptions { kind: Some(kind), ..Default::default() };
        load_weights(&mut vocoder.store, &checkpoint_files(dir)?, options)?;
        if crate::random::active_seed().is_some() {
            // Random weights: the buffers still hold the filters and bases they stand for.
            vocoder.fill_buffers()?;
        }
        vocoder.store.freeze();
        Ok(vocoder)
    }

    /// Writes a random vocoder of `config` (weights drawn from `seed`, Snake parameters
    /// N(0, 0.1²), buffers as [`Self::fill_buffers`] sets them) into `dir`, loadable by
    /// diffusers.
    pub fn write_random(
        dir: &Path,
        seed: u64,
        config: &Ltx2VocoderClass,
    ) -> Result<(), ModelError> {
        let vocoder = Self::new(config, Device::Cpu, Kind::Float)?;
        vocoder.fill_buffers()?;
        let buffers = vocoder.buffers();
        write_component(
            dir,
            &vocoder.store,
            seed,
            config,
            config.class_name(),
            |name, size, rng| {
                if let Some((_, value)) = buffers.iter().find(|(n, _)| n == name) {
                    return Some(value.copy());
                }
                let snake = name.ends_with(".alpha") || name.ends_with(".beta");
                snake.then(|| rng.normal(size, Device::Cpu) * 0.1)
            },
        )
    }

    /// The waveform (B, out_channels, [`Ltx2VocoderClass::samples`]) at
    /// [`Self::output_sampling_rate`] of a mel spectrogram (B, C, frames, mel), C·mel =
    /// `in_channels` (the audio VAE's decoded spectrogram).
    pub fn forward(&self, mel: &Tensor) -> Result<Tensor, ModelError> {
        let size = mel.size();
        let width = self.config.in_channels();
        if size.len() != 4 || size[1] * size[3] != width || size[2] < 1 {
            return Err(ModelError::Input(format!(
                "LTX-2 vocoder spectrogram has shape {size:?}, expected [B, C, frames, mel] \
                 with C·mel = in_channels {width}"
            )));
        }
        let mel = mel.to_kind(self.kind());
        Ok(match &self.net {
            Net::Plain(g) => g.forward(&mel),
            Net::WithBwe(b) => b.forward(&mel),
        })
    }

    /// The waveform's sample rate.
    pub fn output_sampling_rate(&self) -> i64 {
        self.config.output_sampling_rate()
    }

    /// The dtype of the weights (spectrograms are cast to it).
    pub fn kind(&self) -> Kind {
        self.store.variables().values().next().map_or(Kind::Float, Tensor::kind)
    }

    /// The non-learned buffers' values by variable name: every anti-aliasing filter, and the
    /// BWE's STFT bases (a Hann-windowed DFT) and mel filterbank (triangles on the HTK scale).
    fn buffers(&self) -> Vec<(String, Tensor)> {
        let names = self.store.variables().into_keys();
        let filter = |c: &Ltx2VocoderConfig| generator::antialias_filter(c);
        let mut out = vec![];
        for name in names {
            let value = match &self.config {
                _ if !name.ends_with(".filter") && !name.starts_with("mel_stft.") => continue,
                Ltx2VocoderClass::Plain(c) => filter(c),
                Ltx2VocoderClass::WithBwe(c) => match name.as_str() {
                    "mel_stft.mel_basis" => bwe::mel_filterbank(
                        c.num_mel_channels,
                        c.filter_length / 2 + 1,
                        c.input_sampling_rate,
                    ),
                    "mel_stft.stft_fn.forward_basis" => {
                        bwe::stft_bases(c.filter_length, c.window_length).0
                    }
                    "mel_stft.stft_fn.inverse_basis" => {
                        bwe::stft_bases(c.filter_length, c.window_length).1
                    }
                    n if n.starts_with("bwe_generator.") => filter(&c.extender()),
                    _ => filter(&c.stage1()),
                },
            };
            out.push((name, value));
        }
        out
    }

    /// Sets the buffers to [`Self::buffers`].
    fn fill_buffers(&self) -> Result<(), ModelError> {
        let vars = self.store.variables();
        tch::no_grad(|| {
            for (name, value) in self.buffers() {
                vars[&name].shallow_clone().f_copy_(&value)?;
            }
            Ok(())
        })
    }
}
