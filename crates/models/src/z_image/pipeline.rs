//! The Z-Image pipeline: a diffusers `ZImagePipeline` directory loaded as components, and its
//! prompt encoding (Qwen3 chat template, `hidden_states[-2]`, each row's valid tokens), latent
//! layout and schedule.

use std::path::Path;

use flowtune_sampling::{GridRequest, Pipeline, SchedulerConfig};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::ZImageTransformer;
use crate::family::{image_latent_shape, pipeline_parts, run_on, FlowPipeline, PipelineOptions};
use crate::pipeline::PipelineDir;
use crate::text_encoders::qwen3::Qwen3TextEncoder;
use crate::tokenizer::TextTokenizer;
use crate::vae::AutoencoderKl;
use crate::{ModelError, TextConditioning};

/// Text tokens kept per prompt when the options give none (the pipeline's default).
const MAX_SEQUENCE_LENGTH: usize = 512;

/// Qwen3's chat template for one user message with `add_generation_prompt=True,
/// enable_thinking=True`, as `ZImagePipeline` applies it.
pub const CHAT_TEMPLATE: &str = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n";

/// Text-encoder classes the pipeline index may name.
pub const TEXT_ENCODER_CLASSES: &[&str] = &["Qwen3Model", "Qwen3ForCausalLM"];

/// Qwen3 with its tokenizer.
pub struct ZImagePromptEncoder {
    pub encoder: Qwen3TextEncoder,
    pub tokenizer: TextTokenizer,
}

impl ZImagePromptEncoder {
    /// Loads `text_encoder_dir` as `kind` and `tokenizer_dir`.
    pub fn load(
        text_encoder_dir: &Path,
        tokenizer_dir: &Path,
        device: Device,
        kind: Kind,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            encoder: Qwen3TextEncoder::load(text_encoder_dir, device, kind)?,
            tokenizer: TextTokenizer::load(tokenizer_dir)?,
        })
    }

    /// Token ids and mask (B, L) of `prompts` inside the chat template, truncated to
    /// `max_sequence_length` and right-padded to the longest row.
    pub fn tokenize(
        &self,
        prompts: &[&str],
        max_sequence_length: usize,
    ) -> Result<(Tensor, Tensor), ModelError> {
        if prompts.is_empty() || max_sequence_length == 0 {
            return Err(ModelError::Input(format!(
                "Z-Image prompt encoding needs at least one prompt and max_sequence_length ≥ 1, \
                 got {} prompts and {max_sequence_length}",
                prompts.len()
            )));
        }
        let texts: Vec<String> = prompts.iter().map(|p| CHAT_TEMPLATE.replace("{}", p)).collect();
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        self.tokenizer.encode_longest(&texts, max_sequence_length)
    }

    /// `hidden_states[-2]` (B, L, D) of each prompt's tokens, zero past each row's length, and
    /// the mask (B, L) i64 of the valid tokens diffusers keeps. The encoder is causal, so padding
    /// to the longest row instead of to `max_sequence_length` leaves the valid states unchanged.
    pub fn encode(
        &self,
        prompts: &[&str],
        max_sequence_length: usize,
    ) -> Result<(Tensor, Tensor), ModelError> {
        let (ids, mask) = self.tokenize(prompts, max_sequence_length)?;
        let device = self.encoder.store.device();
        let (ids, mask) = (ids.to_device(device), mask.to_device(device));
        let hidden = self.encoder.penultimate(&ids, &mask)?;
        Ok((&hidden * mask.unsqueeze(-1).to_kind(hidden.kind()), mask))
    }
}

/// Every component of a Z-Image pipeline.
pub struct ZImagePipeline {
    pub dir: PipelineDir,
    pub transformer: ZImageTransformer,
    pub vae: AutoencoderKl,
    /// `None` with random weights ([`crate::StandInText`] encodes).
    pub text: Option<ZImagePromptEncoder>,
    pub scheduler: SchedulerConfig,
    /// Text tokens kept per prompt after the template (`max_sequence_length`).
    pub max_sequence_length: usize,
}

impl ZImagePipeline {
    /// Loads the `ZImagePipeline` directory at `path`.
    pub fn load(path: &Path, options: &PipelineOptions) -> Result<Self, ModelError> {
        Self::open(PipelineDir::open(path)?, options)
    }

    /// Loads the components of an opened pipeline directory.
    pub fn open(dir: PipelineDir, options: &PipelineOptions) -> Result<Self, ModelError> {
        let (device, dtypes) = (options.device, options.dtypes);
        let scheduler_dir = dir.component("scheduler", &["FlowMatchEulerDiscreteScheduler"])?;
        Ok(Self {
            transformer: ZImageTransformer::load(
                &dir.component("transformer", &["ZImageTransformer2DModel"])?,
                device,
                dtypes.transformer,
                options.lora.as_ref(),
            )?,
            vae: AutoencoderKl::load(
                &dir.component("vae", &["AutoencoderKL"])?,
                options.vae_device(),
                dtypes.vae,
            )?,
            text: crate::random::text_encoders(options, || {
                ZImagePromptEncoder::load(
                    &dir.component("text_encoder", TEXT_ENCODER_CLASSES)?,
                    &dir.tokenizer("tokenizer")?,
                    options.encoder_device(),
                    dtypes.text_encoders,
                )
            })?,
            scheduler: SchedulerConfig::from_file(&scheduler_dir.join("scheduler_config.json"))?,
            max_sequence_length: options.max_sequence_length.unwrap_or(MAX_SEQUENCE_LENGTH),
            dir,
        })
    }

    /// Pixels per latent cell on a side.
    pub fn vae_scale_factor(&self) -> i64 {
        1 << (self.vae.config.block_out_channels.len() - 1)
    }
}

impl FlowPipeline for ZImagePipeline {
    pipeline_parts!();

    fn device(&self) -> Device {
        self.transformer.x_embedder.weight.device()
    }

    /// Each prompt in the chat template, Qwen3's `hidden_states[-2]`, a mask of the valid tokens
    /// (the transformer takes each row's valid tokens only, as diffusers does).
    fn encode_prompts(&self, prompts: &[&str]) -> Result<TextConditioning, ModelError> {
        let encoder = crate::random::built(&self.text, &self.dir)?;
        let (embeds, mask) = encoder.encode(prompts, self.max_sequence_length)?;
        let (kind, device) = (self.transformer.x_embedder.weight.kind(), self.device());
        let mut text = TextConditioning::new(embeds.to_kind(kind).to_device(device), None);
        text.mask = Some(mask.to_device(device));
        Ok(text)
    }

    /// `[C, H/8, W/8]`; sides must be multiples of 16 (VAE factor × patch size).
    fn latent_shape(&self, height: i64, width: i64) -> Result<Vec<i64>, ModelError> {
        let c = &self.transformer.config;
        image_latent_shape(height, width, c.in_channels, self.vae_scale_factor(), 2)
    }

    /// Z-Image's sigmas, with the image token count `(H/2)·(W/2)` for μ.
    fn grid_request(&self, steps: usize, latent_shape: &[i64]) -> GridRequest {
        let tokens = (latent_shape[1] / 2) * (latent_shape[2] / 2);
        GridRequest {
            steps,
            pipeline: Pipeline::ZImage,
            image_seq_len: Some(tokens as u64),
            ..Default::default()
        }
    }

    fn decode_rgb8(&self, latents: &Tensor) -> Result<Tensor, ModelError> {
        Ok(run_on(self.vae.store.device(), latents, |l| self.vae.decode_rgb8(l)))
    }

    fn encode_rgb8(&self, images: &Tensor) -> Result<Tensor, ModelError> {
        Ok(run_on(self.vae.store.device(), images, |i| self.vae.encode_rgb8(i)))
    }

    fn trained_stores(&self) -> Vec<(&'static str, &'static str, &VarStore)> {
        vec![("transformer", "diffusion_pytorch_model.safetensors", &self.transformer.weights.base)]
    }
}
