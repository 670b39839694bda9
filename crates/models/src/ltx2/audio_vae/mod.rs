//! `AutoencoderKLLTX2Audio`: LTX-2's VAE of mel spectrograms laid out (B, channels, time, mel),
//! 4× smaller in time and mel, causal in time for the released layout, and the pipeline's
//! handling of its latents: packed as tokens (B, L, C·M) (all mel bins of a latent row in one
//! token), normalised per token feature with the checkpoint's `latents_mean` / `latents_std`.
//!
//! Not ported: batch slicing (`enable_slicing`), which gives the same result.

mod blocks;
mod config;

use std::path::Path;

use flowtune_sampling::SampleRng;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::nn::Scope;
use crate::weights::{checkpoint_files, load_weights, LoadOptions};
use crate::{read_config, ModelError};
use blocks::{Decoder, Encoder};
pub use config::Ltx2AudioVaeConfig;

/// diffusers' `LATENT_DOWNSAMPLE_FACTOR`: spectrogram frames and mel bins per latent cell.
const COMPRESSION: i64 = 4;

/// The VAE: `encoder`, `decoder` and the `latents_mean` / `latents_std` buffers below the
/// store's root.
pub struct AutoencoderKlLtx2Audio {
    pub config: Ltx2AudioVaeConfig,
    encoder: Encoder,
    decoder: Decoder,
    latents_mean: Tensor,
    latents_std: Tensor,
    pub store: VarStore,
}

impl AutoencoderKlLtx2Audio {
    /// The module tree of `config` for `kind` weights, unfilled.
    pub fn new(
        config: &Ltx2AudioVaeConfig,
        device: Device,
        kind: Kind,
    ) -> Result<Self, ModelError> {
        config.validate().map_err(ModelError::Input)?;
        let store = crate::weights::store(device, kind);
        let root = Scope::root(store.root(), None);
        let stats = [config.base_channels];
        Ok(Self {
            config: config.clone(),
            encoder: Encoder::new(&(&root / "encoder"), config),
            decoder: Decoder::new(&(&root / "decoder"), config),
            latents_mean: root.var("latents_mean", &stats),
            latents_std: root.var("latents_std", &stats),
            store,
        })
    }

    /// Loads a diffusers `audio_vae/` directory, frozen.
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let path = dir.join("config.json");
        let config: Ltx2AudioVaeConfig = read_config(&path)?;
        config
            .validate()
            .map_err(|message| ModelError::Format { path: path.display().to_string(), message })?;
        let mut vae = Self::new(&config, device, kind)?;
        load_vae(&mut vae.store, dir, kind, [&vae.latents_mean, &vae.latents_std])?;
        Ok(vae)
    }

    /// Writes a random VAE of `config` (weights drawn from `seed`; latents_mean N(0, 0.5²),
    /// latents_std in [0.5, 2)) into `dir`, loadable by diffusers.
    pub fn write_random(
        dir: &Path,
        seed: u64,
        config: &Ltx2AudioVaeConfig,
    ) -> Result<(), ModelError> {
        let vae = Self::new(config, Device::Cpu, Kind::Float)?;
        write_component(
            dir,
            &vae.store,
            seed,
            config,
            "AutoencoderKLLTX2Audio",
            |name, size, rng| match name {
                "latents_mean" => Some(rng.normal(size, Device::Cpu) * 0.5),
                "latents_std" => Some(rng.uniform(size, Device::Cpu) * 1.5 + 0.5),
                _ => None,
            },
        )
    }

    /// The posterior mean and log-variance (clamped to [−30, 20], as diffusers'
    /// `DiagonalGaussianDistribution`) of a mel spectrogram (B, in_channels, T, mel_bins): each
    /// (B, latent_channels, ⌈T/4⌉, mel_bins/4) for the released layout.
    pub fn encode(&self, mel: &Tensor) -> Result<(Tensor, Tensor), ModelError> {
        let c = &self.config;
        let size = mel.size();
        if size.len() != 4 || size[1] != c.in_channels || size[2] < 1 || size[3] < COMPRESSION {
            return Err(ModelError::Input(format!(
                "LTX-2 audio VAE spectrogram has shape {size:?}, expected [B, {}, frames, mel \
                 bins ≥ {COMPRESSION}]",
                c.in_channels
            )));
        }
        let moments = self.encoder.forward(&mel.to_kind(self.kind()));
        let [mean, logvar]: [Tensor; 2] = moments.chunk(2, 1).try_into().expect("two halves");
        Ok((mean, logvar.clamp(-30.0, 20.0)))
    }

    /// The mel spectrogram (B, output_channels, max(4L − 3, 1), mel_bins) of raw latents
    /// (B, latent_channels, L, m), as `audio_vae.decode`.
    pub fn decode(&self, latents: &Tensor) -> Result<Tensor, ModelError> {
        let size = latents.size();
        if size.len() != 4 || size[1] != self.config.latent_channels {
            return Err(ModelError::Input(format!(
                "LTX-2 audio VAE latents have shape {size:?}, expected [B, {}, frames, mel bins]",
                self.config.latent_channels
            )));
        }
        Ok(self.decoder.forward(&latents.to_kind(self.kind())))
    }

    /// The spectrogram of the denoiser's packed, normalised tokens (B, L, latent · mel/4), as
    /// LTX2Pipeline decodes them: denormalise, unpack, decode.
    pub fn decode_tokens(&self, tokens: &Tensor) -> Result<Tensor, ModelError> {
        let latents = self.denormalize_latents(tokens)?;
        self.decode(&unpack_latents(&latents, self.config.latent_mel_bins())?)
    }

    /// The denoiser's packed, normalised tokens (B, L, latent · mel/4) of a spectrogram's
    /// posterior mean, as LTX2Pipeline prepares given audio latents: pack, normalise.
    pub fn encode_tokens(&self, mel: &Tensor) -> Result<Tensor, ModelError> {
        let (mean, _) = self.encode(mel)?;
        self.normalize_latents(&pack_latents(&mean)?)
    }

    /// The dtype of the weights (inputs are cast to it).
    pub fn kind(&self) -> Kind {
        self.latents_mean.kind()
    }

    /// Per token feature mean of the packed latents (`base_channels` values).
    pub fn latents_mean(&self) -> &Tensor {
        &self.latents_mean
    }

    /// Per token feature deviation of the packed latents.
    pub fn latents_std(&self) -> &Tensor {
        &self.latents_std
    }

    /// `_normalize_audio_latents`: `(tokens − mean) / std` over the last dimension of packed
    /// latents (B, L, D), D = `base_channels`.
    pub fn normalize_latents(&self, tokens: &Tensor) -> Result<Tensor, ModelError> {
        let (mean, std) = self.stats_for(tokens)?;
        Ok((tokens - mean) / std)
    }

    /// `_denormalize_audio_latents`: `tokens · std + mean`.
    pub fn denormalize_latents(&self, tokens: &Tensor) -> Result<Tensor, ModelError> {
        let (mean, std) = self.stats_for(tokens)?;
        Ok(tokens * std + mean)
    }

    fn stats_for(&self, tokens: &Tensor) -> Result<(Tensor, Tensor), ModelError> {
        let width = self.config.base_channels;
        if tokens.dim() != 3 || tokens.size()[2] != width {
            return Err(ModelError::Input(format!(
                "packed audio latents have shape {:?}, expected [B, L, {width}] (latents_mean \
                 has {width} entries)",
                tokens.size()
            )));
        }
        let like = |t: &Tensor| t.to_kind(tokens.kind()).to_device(tokens.device());
        Ok((like(&self.latents_mean), like(&self.latents_std)))
    }

    /// Spectrogram frames per latent frame (`temporal_compression_ratio`).
    pub fn temporal_compression_ratio(&self) -> i64 {
        COMPRESSION
    }

    /// Mel bins per latent mel bin (`mel_compression_ratio`).
    pub fn mel_compression_ratio(&self) -> i64 {
        COMPRESSION
    }

    /// Latent frames per second of audio: `sample_rate / mel_hop_length / 4` (25 for LTX-2);
    /// the pipeline takes `round(duration · this)` frames.
    pub fn latents_per_second(&self) -> f64 {
        self.config.sample_rate as f64 / self.config.mel_hop_length as f64 / COMPRESSION as f64
    }

    /// Latent frames of `seconds` of audio, as LTX2Pipeline rounds them (half to even).
    pub fn latent_frames(&self, seconds: f64) -> i64 {
        (seconds * self.latents_per_second()).round_ties_even() as i64
    }

    /// Spectrogram frames decoded from `latent_frames`: max(4L − 3, 1).
    pub fn mel_frames(&self, latent_frames: i64) -> i64 {
        (latent_frames * COMPRESSION - (COMPRESSION - 1)).max(1)
    }
}

/// `_pack_audio_latents` without patching: (B, C, L, M) → (B, L, C·M).
pub fn pack_latents(latents: &Tensor) -> Result<Tensor, ModelError> {
    if latents.dim() != 4 {
        return Err(ModelError::Input(format!(
            "audio latents to pack have shape {:?}, expected [B, C, L, M]",
            latents.size()
        )));
    }
    Ok(latents.transpose(1, 2).flatten(2, 3))
}

/// `_unpack_audio_latents` without patching: (B, L, C·M) → (B, C, L, M), M = `latent_mel_bins`.
pub fn unpack_latents(tokens: &Tensor, latent_mel_bins: i64) -> Result<Tensor, ModelError> {
    let size = tokens.size();
    if size.len() != 3 || latent_mel_bins <= 0 || size[2] % latent_mel_bins != 0 {
        return Err(ModelError::Input(format!(
            "packed audio latents have shape {size:?}, expected [B, L, C·{latent_mel_bins}]"
        )));
    }
    Ok(tokens.unflatten(2, [-1, latent_mel_bins]).transpose(1, 2))
}

/// Fills every variable of `store` from `seed` (in name order: `special` values where it gives
/// them, else biases N(0, 0.1²), 1-D weights 1 + N(0, 0.1²), other weights N(0, 1/fan-in)) and
/// writes it with `config` (`_class_name` set to `class`) into `dir`, created if missing.
/// Fills a VAE's `store` from the checkpoint in `dir` and freezes it; with random weights its
/// latent statistics `[mean, std]` become 0 and 1, which leave latents as they are.
pub(in crate::ltx2) fn load_vae(
    store: &mut VarStore,
    dir: &Path,
    kind: Kind,
    [mean, std]: [&Tensor; 2],
) -> Result<(), ModelError> {
    let options = LoadOptions { kind: Some(kind), ..Default::default() };
    load_weights(store, &checkpoint_files(dir)?, options)?;
    if crate::random::active_seed().is_some() {
        tch::no_grad(|| {
            let _ = mean.shallow_clone().fill_(0.0);
            let _ = std.shallow_clone().fill_(1.0);
        });
    }
    store.freeze();
    Ok(())
}

pub(in crate::ltx2) fn write_component(
    dir: &Path,
    store: &VarStore,
    seed: u64,
    config: &impl serde::Serialize,
    class: &str,
    special: impl Fn(&str, &[i64], &mut SampleRng) -> Option<Tensor>,
) -> Result<(), ModelError> {
    let mut rng = SampleRng::new(seed);
    let mut vars: Vec<(String, Tensor)> = store.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    tch::no_grad(|| -> Result<(), ModelError> {
        for (name, var) in &vars {
            let size = var.size();
            let value = match special(name, &size, &mut rng) {
                Some(value) => value,
                None => {
                    let noise = rng.normal(&size, Device::Cpu);
                    if name.ends_with("bias") {
                        noise * 0.1
                    } else if size.len() == 1 {
                        noise * 0.1 + 1.0
                    } else {
                        noise / (size[1..].iter().product::<i64>() as f64).sqrt()
                    }
                }
            };
            var.shallow_clone().f_copy_(&value)?;
        }
        Ok(())
    })?;
    std::fs::create_dir_all(dir)
        .map_err(|e| ModelError::Io { path: dir.display().to_string(), message: e.to_string() })?;
    Tensor::write_safetensors(&vars, dir.join("diffusion_pytorch_model.safetensors"))?;
    let mut cfg = serde_json::to_value(config).expect("serialisable config");
    cfg["_class_name"] = serde_json::json!(class);
    cfg["_diffusers_version"] = serde_json::json!(crate::sd3::tiny::DIFFUSERS_VERSION);
    crate::write_json(&dir.join("config.json"), &cfg)
}
