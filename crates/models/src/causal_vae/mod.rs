//! The causal 3-D VAE shared by `AutoencoderKLWan` (Wan2.1 and, with `is_residual`, Wan2.2) and
//! `AutoencoderKLQwenImage` (Wan2.1's layout): pictures are one-frame videos; video is encoded in
//! chunks of 1, 4, 4, … frames and decoded one latent frame at a time, each causal convolution
//! continuing from the frames the previous chunk ended with, as diffusers does.
//!
//! Not ported: diffusers' tiled encode/decode (`enable_tiling`) and batch slicing.

mod blocks;
mod coders;
mod layers;
mod residual;

use std::path::Path;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::nn::Scope;
use crate::weights::{checkpoint_files, load_weights, LoadOptions};
use crate::{read_config, ModelError};
use coders::{Decoder, Encoder};
use layers::{CausalConv3d, FrameCache};

/// Frames per encoder chunk after the first (diffusers' fixed 1 + 4 + 4 + … split).
const ENCODER_CHUNK: i64 = 4;

/// The architecture both VAE configs describe.
pub(crate) struct VaeLayout {
    pub base_dim: i64,
    pub decoder_base_dim: i64,
    pub z_dim: i64,
    pub dim_mult: Vec<i64>,
    pub num_res_blocks: usize,
    pub attn_scales: Vec<f64>,
    pub temperal_downsample: Vec<bool>,
    /// Channels the encoder reads and the decoder writes (after patchifying, for Wan2.2).
    pub in_channels: i64,
    pub out_channels: i64,
    pub is_residual: bool,
    /// Convolutions see time (Wan, Qwen-Image); without it every one is a 2-D convolution of
    /// each frame (Qwen-Image 2.1's image VAE: pictures only).
    pub time: bool,
}

impl VaeLayout {
    /// Checks the combinations diffusers would reject or silently misbuild.
    pub fn validate(&self) -> Result<(), String> {
        let levels = self.dim_mult.len();
        if levels == 0
            || self.dim_mult.iter().any(|&m| m <= 0)
            || self.base_dim <= 0
            || self.decoder_base_dim <= 0
        {
            return Err(format!(
                "dim_mult {:?}, base_dim {} and decoder_base_dim {} must be positive (at least \
                 one level)",
                self.dim_mult, self.base_dim, self.decoder_base_dim
            ));
        }
        if self.temperal_downsample.len() != levels - 1 {
            return Err(format!(
                "temperal_downsample has {} entries; dim_mult {:?} has {} downsampling levels",
                self.temperal_downsample.len(),
                self.dim_mult,
                levels - 1
            ));
        }
        if self.is_residual {
            self.check_residual_groups()?;
        }
        Ok(())
    }

    /// `AvgDown3D` and `DupUp3D` fold channels in whole groups.
    fn check_residual_groups(&self) -> Result<(), String> {
        let levels = self.dim_mult.len();
        let temporal = |t: bool| if t { 8 } else { 4 };
        let enc: Vec<i64> = std::iter::once(1)
            .chain(self.dim_mult.iter().copied())
            .map(|m| m * self.base_dim)
            .collect();
        for i in 0..levels {
            let factor = if i + 1 < levels { temporal(self.temperal_downsample[i]) } else { 1 };
            if (enc[i] * factor) % enc[i + 1] != 0 {
                return Err(format!(
                    "is_residual: encoder level {i} folds {} channels ×{factor} into {}, which \
                     does not divide; adjust base_dim or dim_mult",
                    enc[i],
                    enc[i + 1]
                ));
            }
        }
        let top = *self.dim_mult.last().expect("checked non-empty");
        let dec: Vec<i64> = std::iter::once(top)
            .chain(self.dim_mult.iter().rev().copied())
            .map(|m| m * self.decoder_base_dim)
            .collect();
        for i in 0..levels - 1 {
            let factor = temporal(self.temperal_downsample[levels - 2 - i]);
            if (dec[i + 1] * factor) % dec[i] != 0 {
                return Err(format!(
                    "is_residual: decoder level {i} repeats {} channels into {} ×{factor}, which \
                     does not divide; adjust decoder_base_dim or dim_mult",
                    dec[i],
                    dec[i + 1]
                ));
            }
        }
        Ok(())
    }
}

/// The encoder, decoder and their 1×1×1 `quant_conv` / `post_quant_conv`, named like the
/// checkpoint keys below the scope it is built in.
pub(crate) struct CausalVae {
    encoder: Encoder,
    quant_conv: CausalConv3d,
    post_quant_conv: CausalConv3d,
    decoder: Decoder,
}

/// A VAE `config.json` that lays out a causal VAE (Qwen-Image's, Wan's).
pub(crate) trait CausalVaeConfig: serde::de::DeserializeOwned {
    /// Whether the settings can be built; the message names the key.
    fn check(&self) -> Result<(), String>;
    /// The module layout of these settings.
    fn vae_layout(&self) -> VaeLayout;
}

impl CausalVae {
    /// The module tree of `config` at the root of a fresh store on `device` for `kind` weights,
    /// unfilled.
    pub fn build<C: CausalVaeConfig>(
        config: &C,
        device: Device,
        kind: Kind,
    ) -> Result<(Self, VarStore), ModelError> {
        config.check().map_err(ModelError::Input)?;
        let store = crate::weights::store(device, kind);
        let vae = Self::new(&Scope::root(store.root(), None), &config.vae_layout());
        Ok((vae, store))
    }

    /// A diffusers `vae/` directory: its config, the module tree and the weights (as `kind`,
    /// frozen).
    pub fn load<C: CausalVaeConfig>(
        dir: &Path,
        device: Device,
        kind: Kind,
    ) -> Result<(C, Self, VarStore), ModelError> {
        let path = dir.join("config.json");
        let config: C = read_config(&path)?;
        config
            .check()
            .map_err(|message| ModelError::Format { path: path.display().to_string(), message })?;
        let (vae, mut store) = Self::build(&config, device, kind)?;
        let options = LoadOptions { kind: Some(kind), ..Default::default() };
        load_weights(&mut store, &checkpoint_files(dir)?, options)?;
        store.freeze();
        Ok((config, vae, store))
    }

    /// The module tree of a validated `layout` below `root`.
    pub fn new(root: &Scope<'_>, layout: &VaeLayout) -> Self {
        let z = layout.z_dim;
        Self {
            encoder: Encoder::new(&(root / "encoder"), layout),
            quant_conv: CausalConv3d::new(
                &(root / "quant_conv"),
                2 * z,
                2 * z,
                [1; 3],
                [1; 3],
                layout.time,
            ),
            post_quant_conv: CausalConv3d::new(
                &(root / "post_quant_conv"),
                z,
                z,
                [1; 3],
                [1; 3],
                layout.time,
            ),
            decoder: Decoder::new(&(root / "decoder"), layout),
        }
    }

    /// Raw latents (B, z, F, h, w) to the decoder's output (B, out_channels, T, H, W), not
    /// clamped; every latent frame after the first becomes 2^(temporal levels) frames.
    pub fn decode(&self, latents: &Tensor) -> Tensor {
        let x = self.post_quant_conv.forward(&latents.to_kind(self.decoder_kind()), None);
        let frames = x.size()[2];
        let mut cache = FrameCache::new();
        let out: Vec<Tensor> = (0..frames)
            .map(|i| {
                cache.start_chunk(i + 1 == frames);
                self.decoder.forward(&x.narrow(2, i, 1), &mut cache)
            })
            .collect();
        Tensor::cat(&out, 2)
    }

    /// The posterior mean and log-variance (clamped to [−30, 20], as diffusers'
    /// `DiagonalGaussianDistribution`) of video (B, in_channels, T, H, W): 1 + 4k frames give
    /// 1 + k·4/2^(temporal levels) latent frames; frames after the last full group of four are
    /// ignored, as in diffusers.
    pub fn encode(&self, video: &Tensor) -> (Tensor, Tensor) {
        let video = video.to_kind(self.encoder_kind());
        let chunks = 1 + (video.size()[2] - 1) / ENCODER_CHUNK;
        let mut cache = FrameCache::new();
        let out: Vec<Tensor> = (0..chunks)
            .map(|i| {
                cache.start_chunk(i + 1 == chunks);
                let (start, len) = if i == 0 { (0, 1) } else { (1 + ENCODER_CHUNK * (i - 1), 4) };
                self.encoder.forward(&video.narrow(2, start, len), &mut cache)
            })
            .collect();
        let moments = self.quant_conv.forward(&Tensor::cat(&out, 2), None);
        let [mean, logvar]: [Tensor; 2] = moments.chunk(2, 1).try_into().expect("two halves");
        (mean, logvar.clamp(-30.0, 20.0))
    }

    /// The dtype of the decoder weights (latents are cast to it).
    pub fn decoder_kind(&self) -> Kind {
        self.post_quant_conv.kind()
    }

    /// The dtype of the encoder weights (pictures are cast to it).
    pub fn encoder_kind(&self) -> Kind {
        self.quant_conv.kind()
    }
}

/// Checks that `latents_mean` and `latents_std` have `z_dim` entries and the deviations are
/// positive.
pub(crate) fn check_stats(z_dim: i64, mean: &[f64], std: &[f64]) -> Result<(), String> {
    for (name, stats) in [("latents_mean", mean), ("latents_std", std)] {
        if stats.len() as i64 != z_dim {
            return Err(format!("{name} has {} entries; expected z_dim = {z_dim}", stats.len()));
        }
    }
    if std.iter().any(|&s| s <= 0.0) {
        return Err("latents_std must be positive".into());
    }
    Ok(())
}

/// Per-channel statistics as a (1, z, 1, 1, 1) tensor of `like`'s dtype and device.
pub(crate) fn channel_stats(values: &[f64], like: &Tensor) -> Tensor {
    Tensor::from_slice(values).to_kind(like.kind()).to_device(like.device()).view([
        1,
        values.len() as i64,
        1,
        1,
        1,
    ])
}

/// Fills `store` with random weights drawn from `seed` the same way on every machine (weights
/// N(0, 1/fan-in), biases N(0, 0.1²), norm scales 1 + N(0, 0.1²)) and writes it with `config`
/// (`_class_name` set to `class`) into `dir` (created if missing).
pub(crate) fn write_random_vae(
    dir: &std::path::Path,
    store: &tch::nn::VarStore,
    seed: u64,
    config: &impl serde::Serialize,
    class: &str,
) -> Result<(), crate::ModelError> {
    let mut rng = flowtune_sampling::SampleRng::new(seed);
    let mut vars: Vec<(String, Tensor)> = store.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    tch::no_grad(|| -> Result<(), crate::ModelError> {
        for (name, var) in &vars {
            let size = var.size();
            let noise = rng.normal(&size, tch::Device::Cpu);
            let value = if name.ends_with(".gamma") {
                noise * 0.1 + 1.0
            } else if name.ends_with(".bias") {
                noise * 0.1
            } else {
                let fan_in: i64 = size[1..].iter().product();
                noise / (fan_in as f64).sqrt()
            };
            var.shallow_clone().f_copy_(&value)?;
        }
        Ok(())
    })?;
    std::fs::create_dir_all(dir).map_err(|e| crate::ModelError::Io {
        path: dir.display().to_string(),
        message: e.to_string(),
    })?;
    Tensor::write_safetensors(&vars, dir.join("diffusion_pytorch_model.safetensors"))?;
    let mut cfg = serde_json::to_value(config).expect("serialisable config");
    cfg["_class_name"] = serde_json::json!(class);
    cfg["_diffusers_version"] = serde_json::json!(crate::sd3::tiny::DIFFUSERS_VERSION);
    crate::write_json(&dir.join("config.json"), &cfg)
}
