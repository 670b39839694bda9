//! `AutoencoderKLFlux2`: an `AutoencoderKL` with quant convs whose latents the pipelines patchify
//! 2×2 and normalise with the VAE's batch-norm running statistics (`bn`).

use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::nn::Scope;
use crate::vae::{AutoencoderKl, VaeConfig};
use crate::weights::{checkpoint_files, load_weights, LoadOptions};
use crate::{read_config, ModelError};

/// Mirror of `vae/config.json` of `AutoencoderKLFlux2`, with diffusers' defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Flux2VaeConfig {
    #[serde(rename = "_class_name", skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
    pub in_channels: i64,
    pub out_channels: i64,
    pub down_block_types: Vec<String>,
    pub up_block_types: Vec<String>,
    pub block_out_channels: Vec<i64>,
    /// A decoder of other widths than the encoder's is not supported (`null` or the same).
    pub decoder_block_out_channels: Option<Vec<i64>>,
    pub layers_per_block: usize,
    pub act_fn: String,
    pub latent_channels: i64,
    pub norm_num_groups: i64,
    pub sample_size: i64,
    pub use_quant_conv: bool,
    pub use_post_quant_conv: bool,
    pub mid_block_add_attention: bool,
    pub batch_norm_eps: f64,
    pub batch_norm_momentum: f64,
    /// The patch the batch norm's channels cover (2×2).
    pub patch_size: [i64; 2],
}

impl Default for Flux2VaeConfig {
    fn default() -> Self {
        Self {
            class_name: Some("AutoencoderKLFlux2".into()),
            in_channels: 3,
            out_channels: 3,
            down_block_types: vec!["DownEncoderBlock2D".into(); 4],
            up_block_types: vec!["UpDecoderBlock2D".into(); 4],
            block_out_channels: vec![128, 256, 512, 512],
            decoder_block_out_channels: None,
            layers_per_block: 2,
            act_fn: "silu".into(),
            latent_channels: 32,
            norm_num_groups: 32,
            sample_size: 1024,
            use_quant_conv: true,
            use_post_quant_conv: true,
            mid_block_add_attention: true,
            batch_norm_eps: 1e-4,
            batch_norm_momentum: 0.1,
            patch_size: [2, 2],
        }
    }
}

impl Flux2VaeConfig {
    /// Pixels per latent cell on a side (the VAE's factor × the 2×2 patch).
    pub fn scale_factor(&self) -> i64 {
        2 << (self.block_out_channels.len() - 1)
    }

    /// The plain `AutoencoderKL` inside (no scaling or shift: the batch norm normalises).
    fn autoencoder(&self) -> Result<VaeConfig, String> {
        if self.patch_size != [2, 2] {
            return Err(format!(
                "patch_size {:?} is not supported; expected [2, 2]",
                self.patch_size
            ));
        }
        if let Some(d) =
            self.decoder_block_out_channels.as_ref().filter(|d| **d != self.block_out_channels)
        {
            return Err(format!(
                "decoder_block_out_channels {d:?} differ from block_out_channels {:?}; not \
                 supported",
                self.block_out_channels
            ));
        }
        Ok(VaeConfig {
            class_name: self.class_name.clone(),
            in_channels: self.in_channels,
            out_channels: self.out_channels,
            latent_channels: self.latent_channels,
            block_out_channels: self.block_out_channels.clone(),
            down_block_types: self.down_block_types.clone(),
            up_block_types: self.up_block_types.clone(),
            layers_per_block: self.layers_per_block,
            norm_num_groups: self.norm_num_groups,
            act_fn: self.act_fn.clone(),
            sample_size: self.sample_size,
            scaling_factor: 1.0,
            shift_factor: None,
            use_quant_conv: self.use_quant_conv,
            use_post_quant_conv: self.use_post_quant_conv,
            mid_block_add_attention: self.mid_block_add_attention,
            force_upcast: false,
        })
    }
}

/// The FLUX.2 VAE; its diffusion latents are (B, 4·latent_channels, H/2f, W/2f): 2×2 patches of
/// the posterior mean, normalised by the batch norm's running statistics.
pub struct Flux2Vae {
    pub config: Flux2VaeConfig,
    pub autoencoder: AutoencoderKl,
    /// `bn.running_mean`, `bn.running_var` (4·latent_channels).
    pub running_mean: Tensor,
    pub running_var: Tensor,
}

impl Flux2Vae {
    /// Variables for `config` (zeros until loaded).
    pub fn new(config: &Flux2VaeConfig, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let inner = config.autoencoder().map_err(ModelError::Input)?;
        let autoencoder = AutoencoderKl::new(&inner, device, kind)?;
        let bn = &Scope::root(autoencoder.store.root(), None) / "bn";
        let channels = 4 * config.latent_channels;
        Ok(Self {
            running_mean: bn.var("running_mean", &[channels]),
            running_var: bn.var("running_var", &[channels]),
            config: config.clone(),
            autoencoder,
        })
    }

    /// Loads a diffusers `vae/` directory, frozen (`bn.num_batches_tracked` is not kept).
    pub fn load(dir: &Path, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let file = dir.join("config.json");
        let config: Flux2VaeConfig = read_config(&file)?;
        let mut model = Self::new(&config, device, kind)
            .map_err(|e| ModelError::Input(format!("{}: {e}", file.display())))?;
        let options = LoadOptions {
            kind: Some(kind),
            ignored_suffixes: &["bn.num_batches_tracked"],
            ..Default::default()
        };
        load_weights(&mut model.autoencoder.store, &checkpoint_files(dir)?, options)?;
        model.autoencoder.store.freeze();
        Ok(model)
    }

    /// Pixels per latent cell on a side ([`Flux2VaeConfig::scale_factor`]).
    pub fn scale_factor(&self) -> i64 {
        self.config.scale_factor()
    }

    /// (mean, std) of the batch norm as (1, C, 1, 1) in `kind`.
    fn statistics(&self, kind: Kind) -> (Tensor, Tensor) {
        let view = |t: &Tensor| t.view([1, -1, 1, 1]).to_kind(kind);
        let std = (&self.running_var + self.config.batch_norm_eps).sqrt();
        (view(&self.running_mean), view(&std))
    }

    /// Images in [−1, 1] (B, 3, H, W) of diffusion latents.
    pub fn decode(&self, latents: &Tensor) -> Tensor {
        let (mean, std) = self.statistics(latents.kind());
        let z = latents * std + mean;
        let (b, c, h, w) = z.size4().expect("4-d latents");
        let z = z.reshape([b, c / 4, 2, 2, h, w]).permute([0, 1, 4, 2, 5, 3]);
        self.autoencoder.decode(&z.reshape([b, c / 4, 2 * h, 2 * w]))
    }

    /// Diffusion latents of images in [−1, 1]: the posterior mean, patchified and normalised.
    pub fn encode(&self, images: &Tensor) -> Tensor {
        let z = self.autoencoder.encode(images).0;
        let (b, c, h, w) = z.size4().expect("4-d posterior");
        let z = z.view([b, c, h / 2, 2, w / 2, 2]).permute([0, 1, 3, 5, 2, 4]);
        let z = z.reshape([b, 4 * c, h / 2, w / 2]);
        let (mean, std) = self.statistics(z.kind());
        (z - mean) / std
    }

    /// u8 RGB images (B, H, W, 3) of diffusion latents, decoded in the decoder's dtype.
    pub fn decode_rgb8(&self, latents: &Tensor) -> Tensor {
        let kind = self.autoencoder.decoder_kind();
        AutoencoderKl::to_rgb8(&self.decode(&latents.to_kind(kind)))
    }

    /// Clean latents (f32) of u8 RGB images (B, H, W, 3).
    pub fn encode_rgb8(&self, images: &Tensor) -> Tensor {
        let kind = self.autoencoder.decoder_kind();
        self.encode(&AutoencoderKl::from_rgb8(images).to_kind(kind)).to_kind(Kind::Float)
    }
}
