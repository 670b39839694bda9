//! Mirror of `audio_vae/config.json` of `AutoencoderKLLTX2Audio`.

use serde::{Deserialize, Serialize};

/// `AutoencoderKLLTX2Audio` config, with diffusers' field names and defaults (LTX-2's released
/// VAE: stereo 64-bin mel spectrograms at 16 kHz, hop 160, to 8 latent channels, 4× in time and
/// mel).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Ltx2AudioVaeConfig {
    #[serde(rename = "_class_name", skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
    /// Channels of the first level; level i has `base_channels · ch_mult[i]`. Also the length of
    /// the `latents_mean` / `latents_std` buffers (the packed token width, latent · mel / 4).
    pub base_channels: i64,
    /// Spectrogram channels the decoder writes (2: stereo).
    pub output_channels: i64,
    pub ch_mult: Vec<i64>,
    pub num_res_blocks: usize,
    /// Resolutions (`resolution`, halved per level) whose blocks are followed by attention.
    pub attn_resolutions: Option<Vec<i64>>,
    /// Spectrogram channels the encoder reads.
    pub in_channels: i64,
    /// Nominal resolution of the first level (only selects the attention levels).
    pub resolution: i64,
    pub latent_channels: i64,
    /// `pixel` (RMS over channels) or `group` (32 groups; only with `causality_axis: none`).
    pub norm_type: String,
    /// Which axis convolutions are causal along: `height` (time), `width`, `width-compatibility`
    /// or `none`.
    pub causality_axis: String,
    /// Training-only; inference ignores it.
    pub dropout: f64,
    pub mid_block_add_attention: bool,
    /// Audio sample rate and mel hop, as the pipeline reads them to size the latents.
    pub sample_rate: i64,
    pub mel_hop_length: i64,
    /// Informational (every layout is causal along `causality_axis`).
    pub is_causal: bool,
    /// Mel bins of the decoded spectrogram (null, which diffusers' decoder allows but the
    /// pipeline cannot size latents from, is refused).
    pub mel_bins: Option<i64>,
    /// The encoder writes mean and log-variance (false, which would halve the posterior's
    /// latent channels, is refused).
    pub double_z: bool,
}

impl Default for Ltx2AudioVaeConfig {
    fn default() -> Self {
        Self {
            class_name: Some("AutoencoderKLLTX2Audio".into()),
            base_channels: 128,
            output_channels: 2,
            ch_mult: vec![1, 2, 4],
            num_res_blocks: 2,
            attn_resolutions: None,
            in_channels: 2,
            resolution: 256,
            latent_channels: 8,
            norm_type: "pixel".into(),
            causality_axis: "height".into(),
            dropout: 0.0,
            mid_block_add_attention: false,
            sample_rate: 16000,
            mel_hop_length: 160,
            is_causal: true,
            mel_bins: Some(64),
            double_z: true,
        }
    }
}

/// `causality_axis`, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Causality {
    None,
    Width,
    WidthCompatibility,
    Height,
}

impl Ltx2AudioVaeConfig {
    /// A tiny random-weight layout of the released one (for `make-tiny ltx2` and tests): 16 mel
    /// bins, 2 latent channels, widths 8 and 16, so that packed tokens are 8 wide, as
    /// `base_channels`.
    pub fn tiny() -> Self {
        Self {
            base_channels: 8,
            ch_mult: vec![1, 2, 2],
            num_res_blocks: 1,
            latent_channels: 2,
            mel_bins: Some(16),
            ..Self::default()
        }
    }

    pub(super) fn causality(&self) -> Causality {
        match self.causality_axis.as_str() {
            "none" => Causality::None,
            "width" => Causality::Width,
            "width-compatibility" => Causality::WidthCompatibility,
            _ => Causality::Height,
        }
    }

    /// Whether the blocks of a level at `resolution` are followed by attention.
    pub(super) fn attends_at(&self, resolution: i64) -> bool {
        self.attn_resolutions.as_ref().is_some_and(|r| r.contains(&resolution))
    }

    /// Mel bins of the spectrogram (validated present).
    pub fn mel(&self) -> i64 {
        self.mel_bins.unwrap_or_default()
    }

    /// Mel bins of one latent row: `mel_bins / 4`.
    pub fn latent_mel_bins(&self) -> i64 {
        self.mel() / super::COMPRESSION
    }

    /// Checks what diffusers would reject or silently misbuild; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        const AXES: [&str; 4] = ["none", "width", "width-compatibility", "height"];
        if !AXES.contains(&self.causality_axis.as_str()) {
            return Err(format!("causality_axis {:?} is not one of {AXES:?}", self.causality_axis));
        }
        match self.norm_type.as_str() {
            "pixel" => {}
            "group" if self.causality_axis == "none" => {}
            "group" => {
                return Err(format!(
                    "norm_type group needs causality_axis none (diffusers refuses causal \
                     blocks with group norm), not {:?}",
                    self.causality_axis
                ))
            }
            other => return Err(format!("norm_type {other:?} is not pixel or group")),
        }
        if self.ch_mult.len() != 3 || self.ch_mult.iter().any(|&m| m <= 0) {
            return Err(format!(
                "ch_mult {:?} must be 3 positive multipliers: the VAE's time and mel \
                 compression is fixed at 4 (two downsamplings)",
                self.ch_mult
            ));
        }
        for (key, value) in [
            ("base_channels", self.base_channels),
            ("in_channels", self.in_channels),
            ("output_channels", self.output_channels),
            ("latent_channels", self.latent_channels),
            ("num_res_blocks", self.num_res_blocks as i64),
            ("sample_rate", self.sample_rate),
            ("mel_hop_length", self.mel_hop_length),
        ] {
            if value <= 0 {
                return Err(format!("{key} must be positive, not {value}"));
            }
        }
        if !self.double_z {
            return Err("double_z false: the posterior would split latent_channels in half, \
                        which the decoder does not read"
                .into());
        }
        match self.mel_bins {
            None => return Err("mel_bins is null: the pipeline sizes latents from it".into()),
            Some(m) if m < super::COMPRESSION => {
                return Err(format!("mel_bins {m} must be at least {}", super::COMPRESSION))
            }
            Some(_) => {}
        }
        if self.norm_type == "group" {
            if let Some(m) = self.ch_mult.iter().find(|&&m| (self.base_channels * m) % 32 != 0) {
                return Err(format!(
                    "norm_type group uses 32 groups: base_channels {} × ch_mult {m} is not a \
                     multiple of 32",
                    self.base_channels
                ));
            }
        }
        Ok(())
    }
}
