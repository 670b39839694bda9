//! Mirror of `transformer/config.json` of `LTX2VideoTransformer3DModel`.

use serde::{Deserialize, Serialize};

/// `LTX2VideoTransformer3DModel` config, with diffusers' field names and defaults (LTX-2.0's).
/// LTX-2.3 sets `gated_attn`, `audio_gated_attn`, `cross_attn_mod`, `audio_cross_attn_mod`, the
/// split rotary layout and `use_prompt_embeddings: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Ltx2TransformerConfig {
    #[serde(rename = "_class_name", skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
    /// Width of a packed video token (latent channels × patch volume).
    pub in_channels: i64,
    /// Width of a predicted video token (`None` means `in_channels`).
    pub out_channels: Option<i64>,
    /// Spatial patch of a video token.
    pub patch_size: i64,
    /// Temporal patch of a video token.
    pub patch_size_t: i64,
    pub num_attention_heads: i64,
    pub attention_head_dim: i64,
    /// Width of the video text states the cross-attention reads.
    pub cross_attention_dim: i64,
    /// The video VAE's (frames, height, width) compression: latent cells to pixel positions.
    pub vae_scale_factors: Vec<i64>,
    /// Seconds (frames axis) and pixels (rows, columns) that span the rotary range.
    pub pos_embed_max_pos: i64,
    pub base_height: i64,
    pub base_width: i64,
    /// A per-head sigmoid gate on every video-query attention's output (LTX-2.3).
    pub gated_attn: bool,
    /// Timestep modulation of the video text cross-attention's query and of the text (LTX-2.3).
    pub cross_attn_mod: bool,
    /// Width of an audio token (latent channels × mel bins).
    pub audio_in_channels: i64,
    pub audio_out_channels: Option<i64>,
    pub audio_patch_size: i64,
    pub audio_patch_size_t: i64,
    pub audio_num_attention_heads: i64,
    pub audio_attention_head_dim: i64,
    /// Width of the audio text states; also the rotary width of the audio↔video attentions.
    pub audio_cross_attention_dim: i64,
    /// Mel frames per audio latent frame.
    pub audio_scale_factor: i64,
    pub audio_pos_embed_max_pos: i64,
    pub audio_sampling_rate: i64,
    pub audio_hop_length: i64,
    pub audio_gated_attn: bool,
    pub audio_cross_attn_mod: bool,
    pub num_layers: usize,
    pub activation_fn: String,
    pub qk_norm: String,
    /// Whether the blocks' RMS norms have a learned scale.
    pub norm_elementwise_affine: bool,
    pub norm_eps: f64,
    /// Width of the text states given to the caption projections (with `use_prompt_embeddings`).
    pub caption_channels: i64,
    pub attention_bias: bool,
    pub attention_out_bias: bool,
    pub rope_theta: f64,
    /// Rotary frequencies `θ^x` in f64 before rounding to f32.
    pub rope_double_precision: bool,
    /// The causal VAE's first-frame shift of temporal positions.
    pub causal_offset: i64,
    pub timestep_scale_multiplier: f64,
    /// With `timestep_scale_multiplier`, scales the timestep of the audio↔video gates.
    pub cross_attn_timestep_scale_multiplier: f64,
    /// `interleaved` (LTX-2.0: channel pairs) or `split` (LTX-2.3: halves of each head).
    pub rope_type: String,
    /// The caption projections of LTX-2.0 (LTX-2.3 projects in the connectors instead).
    pub use_prompt_embeddings: bool,
    /// Chooses the attention processor that can skip attention for spatio-temporal guidance;
    /// same weights, and the same forward without a perturbation mask.
    pub perturbed_attn: bool,
    pub ff_bias: bool,
    pub audio_ff_bias: bool,
    /// `false` (LTX-2.5): a timestep-independent text modulation (not supported).
    pub use_prompt_adaln_single: bool,
    /// `true` (LTX-2.5): a learned keyframe position embedding (not supported).
    pub use_keyframes_abs_pos_embedding: bool,
}

impl Default for Ltx2TransformerConfig {
    fn default() -> Self {
        Self {
            class_name: Some("LTX2VideoTransformer3DModel".into()),
            in_channels: 128,
            out_channels: Some(128),
            patch_size: 1,
            patch_size_t: 1,
            num_attention_heads: 32,
            attention_head_dim: 128,
            cross_attention_dim: 4096,
            vae_scale_factors: vec![8, 32, 32],
            pos_embed_max_pos: 20,
            base_height: 2048,
            base_width: 2048,
            gated_attn: false,
            cross_attn_mod: false,
            audio_in_channels: 128,
            audio_out_channels: Some(128),
            audio_patch_size: 1,
            audio_patch_size_t: 1,
            audio_num_attention_heads: 32,
            audio_attention_head_dim: 64,
            audio_cross_attention_dim: 2048,
            audio_scale_factor: 4,
            audio_pos_embed_max_pos: 20,
            audio_sampling_rate: 16000,
            audio_hop_length: 160,
            audio_gated_attn: false,
            audio_cross_attn_mod: false,
            num_layers: 48,
            activation_fn: "gelu-approximate".into(),
            qk_norm: "rms_norm_across_heads".into(),
            norm_elementwise_affine: false,
            norm_eps: 1e-6,
            caption_channels: 3840,
            attention_bias: true,
            attention_out_bias: true,
            rope_theta: 10000.0,
            rope_double_precision: true,
            causal_offset: 1,
            timestep_scale_multiplier: 1000.0,
            cross_attn_timestep_scale_multiplier: 1000.0,
            rope_type: "interleaved".into(),
            use_prompt_embeddings: true,
            perturbed_attn: false,
            ff_bias: true,
            audio_ff_bias: true,
            use_prompt_adaln_single: true,
            use_keyframes_abs_pos_embedding: false,
        }
    }
}

impl Ltx2TransformerConfig {
    /// A small LTX-2.0-style config (2 layers, 2 heads × 8 for video and audio, 16-channel video
    /// and audio tokens, 24-wide captions) for tiny pipelines and tests.
    pub fn tiny() -> Self {
        Self {
            in_channels: 16,
            out_channels: Some(16),
            num_attention_heads: 2,
            attention_head_dim: 8,
            cross_attention_dim: 16,
            audio_in_channels: 16,
            audio_out_channels: Some(16),
            audio_num_attention_heads: 2,
            audio_attention_head_dim: 8,
            audio_cross_attention_dim: 16,
            num_layers: 2,
            caption_channels: 24,
            ..Default::default()
        }
    }

    /// This config with LTX-2.3's layout switches: gated attention, text modulation of the
    /// cross-attentions, no caption projections (the connectors project), split rotary; and
    /// video heads `head_dim` wide reading `cross_attention_dim`-wide text states.
    pub fn with_ltx23_layout(self, head_dim: i64, cross_attention_dim: i64) -> Self {
        Self {
            attention_head_dim: head_dim,
            cross_attention_dim,
            gated_attn: true,
            audio_gated_attn: true,
            cross_attn_mod: true,
            audio_cross_attn_mod: true,
            use_prompt_embeddings: false,
            rope_type: "split".into(),
            ..self
        }
    }

    /// Width of the video token stream.
    pub fn inner_dim(&self) -> i64 {
        self.num_attention_heads * self.attention_head_dim
    }

    /// Width of the audio token stream.
    pub fn audio_inner_dim(&self) -> i64 {
        self.audio_num_attention_heads * self.audio_attention_head_dim
    }

    /// Width of a predicted video token.
    pub fn out_dim(&self) -> i64 {
        self.out_channels.filter(|&c| c > 0).unwrap_or(self.in_channels)
    }

    /// Width of a predicted audio token.
    pub fn audio_out_dim(&self) -> i64 {
        self.audio_out_channels.filter(|&c| c > 0).unwrap_or(self.audio_in_channels)
    }

    /// Width of the video text states the forward takes (the connector's output).
    pub fn video_text_dim(&self) -> i64 {
        if self.use_prompt_embeddings {
            self.caption_channels
        } else {
            self.cross_attention_dim
        }
    }

    /// Width of the audio text states the forward takes.
    pub fn audio_text_dim(&self) -> i64 {
        if self.use_prompt_embeddings {
            self.caption_channels
        } else {
            self.audio_cross_attention_dim
        }
    }

    /// Whether the text cross-attentions modulate the text by the timestep (LTX-2.3).
    pub fn prompt_modulation(&self) -> bool {
        self.cross_attn_mod || self.audio_cross_attn_mod
    }

    /// Whether the rotary tables turn the two halves of each head (`split`) rather than pairs.
    pub fn split_rope(&self) -> bool {
        self.rope_type == "split"
    }

    /// Checks what flowtune does not run (LTX-2.5 options, audio patches, video and audio tokens of
    /// different widths: the family packs both into one latent) and what diffusers would misbuild.
    pub fn validate(&self) -> Result<(), String> {
        if !self.use_prompt_adaln_single {
            return Err("use_prompt_adaln_single is false: LTX-2.5's timestep-independent text \
                        modulation is not supported"
                .into());
        }
        if self.use_keyframes_abs_pos_embedding {
            return Err("use_keyframes_abs_pos_embedding is true: LTX-2.5's keyframe position \
                        embedding is not supported"
                .into());
        }
        if self.in_channels != self.audio_in_channels {
            return Err(format!(
                "in_channels {} and audio_in_channels {} differ: flowtune packs video and audio \
                 tokens into one latent of one width",
                self.in_channels, self.audio_in_channels
            ));
        }
        if self.out_dim() != self.in_channels || self.audio_out_dim() != self.audio_in_channels {
            return Err(format!(
                "out_channels {} and audio_out_channels {} must equal in_channels {} (the \
                 velocity has the latent's layout)",
                self.out_dim(),
                self.audio_out_dim(),
                self.in_channels
            ));
        }
        if self.audio_patch_size != 1 || self.audio_patch_size_t != 1 {
            return Err(format!(
                "audio_patch_size {} and audio_patch_size_t {} must be 1: LTX2Pipeline packs one \
                 token per audio latent frame",
                self.audio_patch_size, self.audio_patch_size_t
            ));
        }
        for (key, value, want) in [
            ("activation_fn", &self.activation_fn, "gelu-approximate"),
            ("qk_norm", &self.qk_norm, "rms_norm_across_heads"),
        ] {
            if value != want {
                return Err(format!("{key} {value:?} is not supported (only {want:?})"));
            }
        }
        if !["interleaved", "split"].contains(&self.rope_type.as_str()) {
            return Err(format!("rope_type {:?} must be interleaved or split", self.rope_type));
        }
        if self.vae_scale_factors.len() != 3 {
            return Err(format!(
                "vae_scale_factors {:?} must be (frames, height, width)",
                self.vae_scale_factors
            ));
        }
        self.validate_shapes()
    }

    fn validate_shapes(&self) -> Result<(), String> {
        let (dim, audio_dim) = (self.inner_dim(), self.audio_inner_dim());
        let sizes = [
            self.patch_size,
            self.patch_size_t,
            self.num_attention_heads,
            self.attention_head_dim,
            self.audio_num_attention_heads,
            self.audio_attention_head_dim,
            self.in_channels,
        ];
        if sizes.iter().any(|&s| s <= 0) {
            return Err("patch sizes, heads, head widths and channels must be positive".into());
        }
        let projected = self.use_prompt_embeddings || self.prompt_modulation();
        if projected && self.cross_attention_dim != dim {
            return Err(format!(
                "cross_attention_dim {} must equal num_attention_heads × attention_head_dim {dim} \
                 with use_prompt_embeddings or cross-attention modulation",
                self.cross_attention_dim
            ));
        }
        if self.audio_cross_attention_dim != audio_dim {
            return Err(format!(
                "audio_cross_attention_dim {} must equal audio_num_attention_heads × \
                 audio_attention_head_dim {audio_dim} (the audio↔video rotary width)",
                self.audio_cross_attention_dim
            ));
        }
        // (rotary width, positions, heads its split layout groups by).
        let ropes = [
            ("video", dim, 3, self.num_attention_heads),
            ("audio", audio_dim, 1, self.audio_num_attention_heads),
            ("audio↔video (video side)", audio_dim, 1, self.num_attention_heads),
            ("audio↔video (audio side)", audio_dim, 1, self.audio_num_attention_heads),
        ];
        for (what, width, positions, heads) in ropes {
            let even = if self.split_rope() { width % (2 * heads) == 0 } else { width % 2 == 0 };
            if width < 2 * positions || !even {
                return Err(format!(
                    "the {what} rotary width {width} does not fit rope_type {:?} with {heads} \
                     heads",
                    self.rope_type
                ));
            }
        }
        Ok(())
    }
}
