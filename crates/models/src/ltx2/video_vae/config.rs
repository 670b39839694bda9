//! Mirror of `vae/config.json` of `AutoencoderKLLTX2Video`, and the block layout it describes.

use serde::{Deserialize, Serialize};

/// A per-block flag given once for every block or block by block (diffusers takes `bool` or a
/// tuple).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Flags {
    All(bool),
    Each(Vec<bool>),
}

impl Flags {
    /// One flag per block: `All` repeated `n` times, `Each` as given.
    fn expand(&self, n: usize) -> Vec<bool> {
        match self {
            Self::All(flag) => vec![*flag; n],
            Self::Each(flags) => flags.clone(),
        }
    }
}

/// `AutoencoderKLLTX2Video` config, with diffusers' field names and defaults. LTX-2.0's released
/// VAE keeps these but sets `decoder_causal` false and both compression ratios (32, 8)
/// explicitly: 4×4 pixel patches, encoder blocks of 256…2048 channels halving space three times
/// and time three times, 128 latent channels, no decoder timestep conditioning. LTX-2.3's has
/// narrower encoder blocks and four decoder blocks (temporal-only and spatial-only upsamplers,
/// one keeping its width, none residual) with zero padding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Ltx2VideoVaeConfig {
    #[serde(rename = "_class_name", skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
    /// Colour channels read by the encoder and written by the decoder.
    pub in_channels: i64,
    pub out_channels: i64,
    pub latent_channels: i64,
    /// Output channels of each encoder down block.
    pub block_out_channels: Vec<i64>,
    /// Only `LTX2VideoDownBlock3D` exists.
    pub down_block_types: Vec<String>,
    /// Decoder widths, listed from the pixel end (the decoder runs them reversed).
    pub decoder_block_out_channels: Vec<i64>,
    /// Resnets per encoder down block, then of the encoder's mid block.
    pub layers_per_block: Vec<usize>,
    /// Resnets per decoder block from the pixel end; the last entry is the mid block's.
    pub decoder_layers_per_block: Vec<usize>,
    /// Per encoder block: whether it downsamples (`downsample_type`).
    pub spatio_temporal_scaling: Flags,
    /// Per decoder block (pixel end first): whether it upsamples.
    pub decoder_spatio_temporal_scaling: Flags,
    /// Noise injection into decoder resnets (random per call; refused when set).
    pub decoder_inject_noise: Flags,
    /// Per encoder block: `conv` (strided convolution), `spatial`, `temporal` or
    /// `spatiotemporal` (space-to-depth with an averaged residual).
    pub downsample_type: Vec<String>,
    /// Per decoder up block in running order (not reversed): `spatial`, `temporal` or
    /// `spatiotemporal` depth-to-space.
    pub upsample_type: Vec<String>,
    /// Per decoder block (pixel end first): whether the upsampler adds its repeated input.
    pub upsample_residual: Flags,
    /// Per decoder block (pixel end first): the channel reduction of the depth-to-space.
    pub upsample_factor: Vec<i64>,
    /// The decoder's norms are modulated by the embedded decode timestep.
    pub timestep_conditioning: bool,
    pub patch_size: i64,
    /// Only 1 (diffusers' encoder and decoder size their convolutions without it).
    pub patch_size_t: i64,
    /// Epsilon of the shortcut layer norm of channel-changing resnets.
    pub resnet_norm_eps: f64,
    /// The denoiser sees `(z − latents_mean) · scaling_factor / latents_std`.
    pub scaling_factor: f64,
    pub encoder_causal: bool,
    pub decoder_causal: bool,
    /// `zeros`, `reflect`, `replicate` or `circular`.
    pub encoder_spatial_padding_mode: String,
    pub decoder_spatial_padding_mode: String,
    /// Pixels per latent cell and frames per latent frame as the pipeline reads them (`None`:
    /// what the blocks give).
    pub spatial_compression_ratio: Option<i64>,
    pub temporal_compression_ratio: Option<i64>,
}

impl Default for Ltx2VideoVaeConfig {
    fn default() -> Self {
        Self {
            class_name: Some("AutoencoderKLLTX2Video".into()),
            in_channels: 3,
            out_channels: 3,
            latent_channels: 128,
            block_out_channels: vec![256, 512, 1024, 2048],
            down_block_types: vec!["LTX2VideoDownBlock3D".into(); 4],
            decoder_block_out_channels: vec![256, 512, 1024],
            layers_per_block: vec![4, 6, 6, 2, 2],
            decoder_layers_per_block: vec![5, 5, 5, 5],
            spatio_temporal_scaling: Flags::Each(vec![true; 4]),
            decoder_spatio_temporal_scaling: Flags::Each(vec![true; 3]),
            decoder_inject_noise: Flags::Each(vec![false; 4]),
            downsample_type: ["spatial", "temporal", "spatiotemporal", "spatiotemporal"]
                .map(String::from)
                .to_vec(),
            upsample_type: vec!["spatiotemporal".into(); 3],
            upsample_residual: Flags::Each(vec![true; 3]),
            upsample_factor: vec![2, 2, 2],
            timestep_conditioning: false,
            patch_size: 4,
            patch_size_t: 1,
            resnet_norm_eps: 1e-6,
            scaling_factor: 1.0,
            encoder_causal: true,
            decoder_causal: true,
            encoder_spatial_padding_mode: "zeros".into(),
            decoder_spatial_padding_mode: "reflect".into(),
            spatial_compression_ratio: None,
            temporal_compression_ratio: None,
        }
    }
}

/// Spatial padding of the convolutions (`spatial_padding_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Padding {
    Zeros,
    /// Any other mode `torch.nn.functional.pad` names (`reflect`, `replicate`, `circular`).
    Mode(&'static str),
}

impl Padding {
    /// The smallest side the mode pads by one (reflection needs a neighbour to mirror).
    pub fn min_side(self) -> i64 {
        if self == Self::Mode("reflect") {
            2
        } else {
            1
        }
    }
}

/// How an encoder block downsamples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Down {
    None,
    /// A causal convolution of stride 2 in time and space.
    Conv,
    /// Space-to-depth by this (time, height, width) stride.
    Fold([i64; 3]),
}

/// One encoder down block: resnets at `input` channels, then the downsampler to `output`.
#[derive(Debug, Clone)]
pub(super) struct DownPlan {
    pub input: i64,
    pub output: i64,
    pub layers: usize,
    pub down: Down,
}

/// One decoder up block: the time embedding and (if `input ≠ output`) a channel-changing resnet
/// at `input`, the depth-to-space upsampler (from `output · factor` channels), resnets at
/// `output`.
#[derive(Debug, Clone)]
pub(super) struct UpPlan {
    pub input: i64,
    pub output: i64,
    pub layers: usize,
    /// (time, height, width) stride, channel reduction, residual.
    pub up: Option<([i64; 3], i64, bool)>,
}

/// The encoder and decoder blocks a validated config describes.
#[derive(Debug, Clone)]
pub(super) struct Layout {
    pub down: Vec<DownPlan>,
    pub encoder_mid_layers: usize,
    pub decoder_width: i64,
    pub decoder_mid_layers: usize,
    pub up: Vec<UpPlan>,
    pub encoder_padding: Padding,
    pub decoder_padding: Padding,
}

fn stride_of(kind: &str, key: &str, allow_conv: bool) -> Result<Option<[i64; 3]>, String> {
    match kind {
        "spatial" => Ok(Some([1, 2, 2])),
        "temporal" => Ok(Some([2, 1, 1])),
        "spatiotemporal" => Ok(Some([2, 2, 2])),
        "conv" if allow_conv => Ok(None),
        other => Err(format!("{key}: {other:?} is not a known sampling type")),
    }
}

fn padding(mode: &str, key: &str) -> Result<Padding, String> {
    match mode {
        "zeros" => Ok(Padding::Zeros),
        "reflect" => Ok(Padding::Mode("reflect")),
        "replicate" => Ok(Padding::Mode("replicate")),
        "circular" => Ok(Padding::Mode("circular")),
        other => Err(format!("{key}: {other:?} is not zeros, reflect, replicate or circular")),
    }
}

fn check_len(key: &str, len: usize, want: usize, of: &str) -> Result<(), String> {
    if len != want {
        return Err(format!("{key} has {len} entries; {of} needs {want}"));
    }
    Ok(())
}

impl Ltx2VideoVaeConfig {
    /// LTX-2.0's released config (the `vae/config.json` of `Lightricks/LTX-2`).
    pub fn ltx2() -> Self {
        Self {
            decoder_causal: false,
            spatial_compression_ratio: Some(32),
            temporal_compression_ratio: Some(8),
            ..Self::default()
        }
    }

    /// A tiny random-weight layout of the released one (for `make-tiny ltx2` and tests): the
    /// same blocks and compression (32× space, 8× time) at widths 4…16, one resnet per block,
    /// 4 latent channels, no residual in the last upsampler.
    pub fn tiny() -> Self {
        Self {
            latent_channels: 4,
            block_out_channels: vec![4, 8, 8, 8],
            decoder_block_out_channels: vec![4, 8, 16],
            // The last upsampler's 4 channels do not fold by 8.
            upsample_residual: Flags::Each(vec![false, true, true]),
            layers_per_block: vec![1; 5],
            decoder_layers_per_block: vec![1; 4],
            ..Self::ltx2()
        }
    }

    /// The blocks, after checking what diffusers would reject, build wrongly or run randomly;
    /// the message names the key.
    pub(super) fn layout(&self) -> Result<Layout, String> {
        for (key, value) in [
            ("in_channels", self.in_channels),
            ("out_channels", self.out_channels),
            ("latent_channels", self.latent_channels),
            ("patch_size", self.patch_size),
        ] {
            if value < 1 {
                return Err(format!("{key} must be positive, not {value}"));
            }
        }
        if self.patch_size_t != 1 {
            return Err(format!(
                "patch_size_t {} is not supported: diffusers sizes the encoder's and decoder's \
                 convolutions for 1",
                self.patch_size_t
            ));
        }
        if !(self.scaling_factor.is_finite() && self.scaling_factor > 0.0) {
            return Err(format!("scaling_factor must be positive, not {}", self.scaling_factor));
        }
        let blocks = self.block_out_channels.len();
        check_len(
            "layers_per_block",
            self.layers_per_block.len(),
            blocks + 1,
            "one entry per down block and one for the mid block (block_out_channels)",
        )?;
        let scaling = self.spatio_temporal_scaling.expand(blocks);
        check_len("spatio_temporal_scaling", scaling.len(), blocks, "block_out_channels")?;
        check_len("down_block_types", self.down_block_types.len(), blocks, "block_out_channels")?;
        check_len("downsample_type", self.downsample_type.len(), blocks, "block_out_channels")?;
        if let Some(other) = self.down_block_types.iter().find(|t| *t != "LTX2VideoDownBlock3D") {
            return Err(format!("down_block_types: {other:?} is not LTX2VideoDownBlock3D"));
        }
        let mut down = Vec::with_capacity(blocks);
        let mut channels = self.latent_channels;
        for (i, (&output, &scaled)) in self.block_out_channels.iter().zip(&scaling).enumerate() {
            let kind = if scaled {
                match stride_of(&self.downsample_type[i], "downsample_type", true)? {
                    None => Down::Conv,
                    Some(stride) => Down::Fold(stride),
                }
            } else {
                Down::None
            };
            let fits = match kind {
                Down::None | Down::Conv => output == channels,
                Down::Fold(s) => {
                    let n = s.iter().product::<i64>();
                    output > 0 && output % n == 0 && (channels * n) % output == 0
                }
            };
            if !fits {
                return Err(format!(
                    "block_out_channels[{i}] = {output} cannot follow {channels} channels with \
                     downsample_type {:?} (spatio_temporal_scaling {}): diffusers would fail",
                    self.downsample_type[i], scaled
                ));
            }
            down.push(DownPlan {
                input: channels,
                output,
                layers: self.layers_per_block[i],
                down: kind,
            });
            channels = output;
        }

        let n = self.decoder_block_out_channels.len();
        check_len(
            "decoder_layers_per_block",
            self.decoder_layers_per_block.len(),
            n + 1,
            "one entry per up block and one for the mid block (decoder_block_out_channels)",
        )?;
        let up_scaling = self.decoder_spatio_temporal_scaling.expand(n);
        check_len(
            "decoder_spatio_temporal_scaling",
            up_scaling.len(),
            n,
            "decoder_block_out_channels",
        )?;
        check_len("upsample_type", self.upsample_type.len(), n, "decoder_block_out_channels")?;
        let residual = self.upsample_residual.expand(n);
        check_len("upsample_residual", residual.len(), n, "decoder_block_out_channels")?;
        check_len("upsample_factor", self.upsample_factor.len(), n, "decoder_block_out_channels")?;
        let noise = self.decoder_inject_noise.expand(n + 1);
        check_len("decoder_inject_noise", noise.len(), n + 1, "decoder_layers_per_block")?;
        if noise.iter().any(|&b| b) {
            return Err("decoder_inject_noise is not supported (it adds fresh random noise in \
                        every decode)"
                .into());
        }
        // diffusers lists these from the pixel end and runs them reversed (not upsample_type).
        let widths: Vec<i64> = self.decoder_block_out_channels.iter().rev().copied().collect();
        let up_scaling: Vec<bool> = up_scaling.into_iter().rev().collect();
        let layers: Vec<usize> = self.decoder_layers_per_block.iter().rev().copied().collect();
        let residual: Vec<bool> = residual.into_iter().rev().collect();
        let factors: Vec<i64> = self.upsample_factor.iter().rev().copied().collect();
        let decoder_width = *widths.first().ok_or("decoder_block_out_channels is empty")?;
        let mut up = Vec::with_capacity(n);
        let (mut nominal, mut channels) = (decoder_width, decoder_width);
        for i in 0..n {
            let f = factors[i];
            if f < 1 || widths[i] % f != 0 {
                return Err(format!(
                    "upsample_factor {f} must be positive and divide decoder_block_out_channels \
                     {}",
                    widths[i]
                ));
            }
            let (input, output) = (nominal / f, widths[i] / f);
            if input != output {
                if self.timestep_conditioning {
                    return Err(format!(
                        "timestep_conditioning with decoder block {i} changing channels ({input} \
                         → {output}): diffusers passes it the raw timestep and fails"
                    ));
                }
                if channels != input {
                    return Err(format!(
                        "decoder_block_out_channels / upsample_factor: up block {i} expects \
                         {input} channels, gets {channels}"
                    ));
                }
                channels = output;
            }
            let sampler = if up_scaling[i] {
                let stride = stride_of(&self.upsample_type[i], "upsample_type", false)?
                    .expect("no conv upsampler");
                let n = stride.iter().product::<i64>();
                if channels != output * f {
                    return Err(format!(
                        "decoder_block_out_channels / upsample_factor: up block {i}'s upsampler \
                         reads {} channels, gets {channels}",
                        output * f
                    ));
                }
                if residual[i] && (channels % n != 0 || n % f != 0) {
                    return Err(format!(
                        "upsample_residual: up block {i} folds {channels} channels by {n} and \
                         repeats them {n}/{f} times, which does not divide"
                    ));
                }
                channels = output;
                Some((stride, f, residual[i]))
            } else {
                None
            };
            if channels != output {
                return Err(format!(
                    "decoder_block_out_channels / decoder_spatio_temporal_scaling: up block {i}'s \
                     resnets expect {output} channels, get {channels}"
                ));
            }
            up.push(UpPlan { input, output, layers: layers[i + 1], up: sampler });
            nominal = output;
        }

        let layout = Layout {
            down,
            encoder_mid_layers: self.layers_per_block[blocks],
            decoder_width,
            decoder_mid_layers: layers[0],
            up,
            encoder_padding: padding(
                &self.encoder_spatial_padding_mode,
                "encoder_spatial_padding_mode",
            )?,
            decoder_padding: padding(
                &self.decoder_spatial_padding_mode,
                "decoder_spatial_padding_mode",
            )?,
        };
        let (space, time) = layout.encoder_factors();
        let (up_space, up_time) = layout.decoder_factors();
        if (space, time) != (up_space, up_time) {
            return Err(format!(
                "upsample_type / decoder_spatio_temporal_scaling: the decoder upsamples {up_space}× \
                 in space and {up_time}× in time, the encoder downsamples {space}× and {time}×"
            ));
        }
        for (key, given, built) in [
            ("spatial_compression_ratio", self.spatial_compression_ratio, space * self.patch_size),
            ("temporal_compression_ratio", self.temporal_compression_ratio, time),
        ] {
            if given.is_some_and(|g| g != built) {
                return Err(format!(
                    "{key} is {}, but the blocks (downsample_type, spatio_temporal_scaling, \
                     patch_size) give {built}",
                    given.unwrap_or_default()
                ));
            }
        }
        Ok(layout)
    }
}

impl Layout {
    /// The encoder's (spatial, temporal) downsampling, patches aside.
    pub fn encoder_factors(&self) -> (i64, i64) {
        self.down.iter().fold((1, 1), |(s, t), b| match b.down {
            Down::None => (s, t),
            Down::Conv => (s * 2, t * 2),
            Down::Fold(stride) => (s * stride[1], t * stride[0]),
        })
    }

    /// The decoder's (spatial, temporal) upsampling, patches aside.
    pub fn decoder_factors(&self) -> (i64, i64) {
        self.up.iter().fold((1, 1), |(s, t), b| match b.up {
            None => (s, t),
            Some((stride, _, _)) => (s * stride[1], t * stride[0]),
        })
    }
}
