//! The SD3 / SD3.5 pipeline: a diffusers `StableDiffusion3Pipeline` directory loaded as
//! components, and the SD3 prompt encoding.

use std::path::Path;

use flowtune_sampling::{GridRequest, Pipeline, SchedulerConfig};
use tch::nn::VarStore;
use tch::{Device, Tensor};

use super::Sd3Transformer;
use crate::family::{image_latent_shape, pipeline_parts, run_on, FlowPipeline, PipelineOptions};
use crate::pipeline::PipelineDir;
use crate::text_encoders::{clip::ClipTextModel, t5::T5Encoder};
use crate::tokenizer::TextTokenizer;
use crate::vae::AutoencoderKl;
use crate::{ModelError, TextConditioning};

/// A CLIP encoder with its tokenizer.
pub struct ClipBranch {
    pub tokenizer: TextTokenizer,
    pub encoder: ClipTextModel,
}

/// The text encoders with their tokenizers.
pub struct Sd3Text {
    pub clip_l: ClipBranch,
    pub clip_g: ClipBranch,
    /// T5 and its tokenizer; SD3 runs without them (zeros in their place).
    pub t5: Option<(TextTokenizer, T5Encoder)>,
}

impl Sd3Text {
    /// Tokens per CLIP branch: the tokenizer's `model_max_length` (diffusers'
    /// `tokenizer_max_length`), 77 for the real CLIP models.
    pub fn clip_length(&self) -> usize {
        self.clip_l.tokenizer.model_max_length.unwrap_or(CLIP_LENGTH)
    }
}

/// Every component of an SD3 pipeline.
pub struct Sd3Pipeline {
    pub dir: PipelineDir,
    pub transformer: Sd3Transformer,
    /// The VAE; `None` for a pixel-space pipeline (`"vae": [null, null]` in the index), whose
    /// latents are the image itself in [−1, 1].
    pub vae: Option<AutoencoderKl>,
    /// `None` with random weights ([`crate::StandInText`] encodes).
    pub text: Option<Sd3Text>,
    pub scheduler: SchedulerConfig,
    /// Tokens of the T5 part of the prompt (diffusers' `max_sequence_length`, default 256).
    pub t5_max_length: usize,
}

const CLIP_CLASSES: &[&str] = &["CLIPTextModelWithProjection"];
/// CLIP's context when the tokenizer config gives no `model_max_length`.
const CLIP_LENGTH: usize = 77;
/// T5 tokens when the options give no `max_sequence_length` (diffusers' default).
const T5_LENGTH: usize = 256;

impl Sd3Pipeline {
    /// Loads the `StableDiffusion3Pipeline` directory at `path`.
    pub fn load(path: &Path, options: &PipelineOptions) -> Result<Self, ModelError> {
        Self::open(PipelineDir::open(path)?, options)
    }

    /// Loads the components of an opened pipeline directory.
    pub fn open(dir: PipelineDir, options: &PipelineOptions) -> Result<Self, ModelError> {
        let (device, dtypes, lora) = (options.device, options.dtypes, options.lora.as_ref());
        let clip = |encoder: &str, tokenizer: &str| -> Result<ClipBranch, ModelError> {
            Ok(ClipBranch {
                tokenizer: TextTokenizer::load(&dir.tokenizer(tokenizer)?)?,
                encoder: ClipTextModel::load(
                    &dir.component(encoder, CLIP_CLASSES)?,
                    options.encoder_device(),
                    dtypes.text_encoders,
                )?,
            })
        };
        let text = || -> Result<Sd3Text, ModelError> {
            let t5 = if dir.has("text_encoder_3") {
                Some((
                    TextTokenizer::load(&dir.tokenizer("tokenizer_3")?)?,
                    T5Encoder::load(
                        &dir.component("text_encoder_3", &["T5EncoderModel"])?,
                        options.encoder_device(),
                        dtypes.text_encoders,
                    )?,
                ))
            } else {
                None
            };
            Ok(Sd3Text {
                clip_l: clip("text_encoder", "tokenizer")?,
                clip_g: clip("text_encoder_2", "tokenizer_2")?,
                t5,
            })
        };
        let scheduler_dir = dir.component("scheduler", &["FlowMatchEulerDiscreteScheduler"])?;
        Ok(Self {
            transformer: Sd3Transformer::load(
                &dir.component("transformer", &["SD3Transformer2DModel"])?,
                device,
                dtypes.transformer,
                lora,
            )?,
            vae: if dir.has("vae") {
                Some(AutoencoderKl::load(
                    &dir.component("vae", &["AutoencoderKL"])?,
                    options.vae_device(),
                    dtypes.vae,
                )?)
            } else {
                None
            },
            text: crate::random::text_encoders(options, text)?,
            scheduler: SchedulerConfig::from_file(&scheduler_dir.join("scheduler_config.json"))?,
            t5_max_length: options.max_sequence_length.unwrap_or(T5_LENGTH),
            dir,
        })
    }

    /// How many pixels one latent cell spans on a side (1 without a VAE).
    pub fn vae_scale_factor(&self) -> i64 {
        self.vae.as_ref().map_or(1, |v| 1 << (v.config.block_out_channels.len() - 1))
    }

    /// Clean latents → u8 RGB images (B × H × W × 3, on the latents' device).
    fn decode_pixels(&self, latents: &Tensor) -> Tensor {
        match &self.vae {
            Some(vae) => run_on(vae.store.device(), latents, |l| vae.decode_rgb8(l)),
            None => AutoencoderKl::to_rgb8(latents),
        }
    }

    /// u8 RGB images (B × H × W × 3) → clean latents (f32): the VAE posterior mean, or the pixels
    /// in [−1, 1] for a pixel-space pipeline. The inverse of [`Self::decode_pixels`].
    fn encode_pixels(&self, images: &Tensor) -> Tensor {
        match &self.vae {
            Some(vae) => run_on(vae.store.device(), images, |i| vae.encode_rgb8(i)),
            None => AutoencoderKl::from_rgb8(images),
        }
    }

    /// SD3 prompt encoding: CLIP-L ‖ CLIP-G penultimate states (zero-padded to the T5 width),
    /// then T5 states along the sequence (77 + T tokens; zeros of the CLIP length without T5);
    /// pooled = CLIP-L ‖ CLIP-G projections.
    fn encode_text(&self, prompts: &[&str]) -> Result<TextConditioning, ModelError> {
        let text = crate::random::built(&self.text, &self.dir)?;
        let kind = self.transformer.context_embedder.weight.kind();
        let device = self.transformer.context_embedder.weight.device();
        let clip_length = text.clip_length();
        let mut states = vec![];
        let mut pooled = vec![];
        for branch in [&text.clip_l, &text.clip_g] {
            let ids = branch.tokenizer.encode(prompts, clip_length)?;
            let out = branch.encoder.forward(&ids.to_device(branch.encoder.store.device()))?;
            states.push(out.penultimate_hidden_state.to_device(device));
            pooled.push(
                out.text_embeds
                    .ok_or_else(|| {
                        ModelError::Input(
                            "SD3 needs CLIPTextModelWithProjection text encoders".into(),
                        )
                    })?
                    .to_device(device),
            );
        }
        let clip = Tensor::cat(&states, -1).to_kind(kind);
        let joint = self.transformer.config.joint_attention_dim;
        let t5 = match &text.t5 {
            Some((tokenizer, encoder)) => {
                let ids = tokenizer.encode(prompts, self.t5_max_length)?;
                encoder
                    .forward(&ids.to_device(encoder.store.device()))?
                    .to_kind(kind)
                    .to_device(device)
            }
            None => {
                Tensor::zeros([prompts.len() as i64, clip_length as i64, joint], (kind, device))
            }
        };
        let width = clip.size()[2];
        if width > joint || t5.size()[2] != joint {
            return Err(ModelError::Input(format!(
                "text widths do not fit: CLIP-L ‖ CLIP-G is {width}, T5 is {}, the transformer's joint_attention_dim is {joint}",
                t5.size()[2]
            )));
        }
        let clip = clip.constant_pad_nd([0, joint - width]);
        Ok(TextConditioning::new(
            Tensor::cat(&[clip, t5], 1),
            Some(Tensor::cat(&pooled, -1).to_kind(kind)),
        ))
    }
}

impl FlowPipeline for Sd3Pipeline {
    pipeline_parts!();

    fn device(&self) -> Device {
        self.transformer.context_embedder.weight.device()
    }

    /// SD3 prompt encoding (see [`Sd3Pipeline::encode_text`]).
    fn encode_prompts(&self, prompts: &[&str]) -> Result<TextConditioning, ModelError> {
        self.encode_text(prompts)
    }

    /// The transformer's position table bounds the sides too: at most `pos_embed_max_size`
    /// patches each.
    fn latent_shape(&self, height: i64, width: i64) -> Result<Vec<i64>, ModelError> {
        let c = &self.transformer.config;
        let factor = self.vae_scale_factor();
        let most = c.pos_embed_max_size * c.patch_size * factor;
        if height > most || width > most {
            return Err(ModelError::Input(format!(
                "{height}×{width} pixels (model.resolution / --resolution): this transformer's \
                 position table covers sides up to {most} (pos_embed_max_size {} × patch {} × \
                 VAE factor {factor})",
                c.pos_embed_max_size, c.patch_size
            )));
        }
        image_latent_shape(height, width, c.in_channels, factor, c.patch_size)
    }

    /// The scheduler's own grid (SD3 has no dynamic shift).
    fn grid_request(&self, steps: usize, _latent_shape: &[i64]) -> GridRequest {
        GridRequest { steps, pipeline: Pipeline::Sd3, ..Default::default() }
    }

    fn decode_rgb8(&self, latents: &Tensor) -> Result<Tensor, ModelError> {
        Ok(self.decode_pixels(latents))
    }

    fn encode_rgb8(&self, images: &Tensor) -> Result<Tensor, ModelError> {
        Ok(self.encode_pixels(images))
    }

    fn trained_stores(&self) -> Vec<(&'static str, &'static str, &VarStore)> {
        let mut stores = vec![(
            "transformer",
            "diffusion_pytorch_model.safetensors",
            &self.transformer.weights.base,
        )];
        if let Some(text) = &self.text {
            stores.push(("text_encoder", "model.safetensors", &text.clip_l.encoder.store));
            stores.push(("text_encoder_2", "model.safetensors", &text.clip_g.encoder.store));
        }
        stores
    }
}
