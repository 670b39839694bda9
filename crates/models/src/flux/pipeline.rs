//! The FLUX.1 pipeline: a diffusers `FluxPipeline` directory loaded as components, and its
//! prompt encoding, latent layout and schedule.

use std::path::Path;

use flowtune_sampling::{GridRequest, Pipeline, SchedulerConfig};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::{FluxTransformer, GUIDANCE};
use crate::family::{image_latent_shape, pipeline_parts, run_on, FlowPipeline, PipelineOptions};
use crate::pipeline::PipelineDir;
use crate::text_encoders::{clip::ClipTextModel, t5::T5Encoder};
use crate::tokenizer::TextTokenizer;
use crate::vae::AutoencoderKl;
use crate::{ModelError, TextConditioning};

/// CLIP's context when the tokenizer config gives no `model_max_length`.
const CLIP_LENGTH: usize = 77;
/// T5 tokens when the options give no `max_sequence_length` (the pipeline's default).
const T5_LENGTH: usize = 512;
/// The distilled guidance when the options give none (the pipeline's `guidance_scale` default).
pub const DEFAULT_GUIDANCE: f64 = 3.5;
/// Side of the 2×2 token patch.
const PATCH: i64 = 2;

/// The text encoders with their tokenizers.
pub struct FluxText {
    /// CLIP-L (`CLIPTextModel`): its pooled output conditions every block.
    pub clip: (TextTokenizer, ClipTextModel),
    /// T5 (`T5EncoderModel`): its states are the text tokens.
    pub t5: (TextTokenizer, T5Encoder),
}

/// Every component of a FLUX.1 pipeline.
pub struct FluxPipeline {
    pub dir: PipelineDir,
    pub transformer: FluxTransformer,
    pub vae: AutoencoderKl,
    /// `None` with random weights ([`crate::StandInText`] encodes).
    pub text: Option<FluxText>,
    pub scheduler: SchedulerConfig,
    /// T5 tokens per prompt (`max_sequence_length`).
    pub max_sequence_length: usize,
    /// The distilled guidance value [dev] is conditioned on (unused by [schnell]).
    pub guidance: f64,
}

impl FluxPipeline {
    /// Loads the `FluxPipeline` directory at `path`.
    pub fn load(path: &Path, options: &PipelineOptions) -> Result<Self, ModelError> {
        Self::open(PipelineDir::open(path)?, options)
    }

    /// Loads the components of an opened pipeline directory.
    pub fn open(dir: PipelineDir, options: &PipelineOptions) -> Result<Self, ModelError> {
        let (device, dtypes) = (options.device, options.dtypes);
        let text = || -> Result<FluxText, ModelError> {
            Ok(FluxText {
                clip: (
                    TextTokenizer::load(&dir.tokenizer("tokenizer")?)?,
                    ClipTextModel::load(
                        &dir.component("text_encoder", &["CLIPTextModel"])?,
                        options.encoder_device(),
                        dtypes.text_encoders,
                    )?,
                ),
                t5: (
                    TextTokenizer::load(&dir.tokenizer("tokenizer_2")?)?,
                    T5Encoder::load(
                        &dir.component("text_encoder_2", &["T5EncoderModel"])?,
                        options.encoder_device(),
                        dtypes.text_encoders,
                    )?,
                ),
            })
        };
        let scheduler_dir = dir.component("scheduler", &["FlowMatchEulerDiscreteScheduler"])?;
        Ok(Self {
            transformer: FluxTransformer::load(
                &dir.component("transformer", &["FluxTransformer2DModel"])?,
                device,
                dtypes.transformer,
                options.lora.as_ref(),
            )?,
            vae: AutoencoderKl::load(
                &dir.component("vae", &["AutoencoderKL"])?,
                options.vae_device(),
                dtypes.vae,
            )?,
            text: crate::random::text_encoders(options, text)?,
            scheduler: SchedulerConfig::from_file(&scheduler_dir.join("scheduler_config.json"))?,
            max_sequence_length: options.max_sequence_length.unwrap_or(T5_LENGTH),
            guidance: options.embedded_guidance.unwrap_or(DEFAULT_GUIDANCE),
            dir,
        })
    }

    /// Pixels per latent cell on a side.
    pub fn vae_scale_factor(&self) -> i64 {
        1 << (self.vae.config.block_out_channels.len() - 1)
    }
}

impl FlowPipeline for FluxPipeline {
    pipeline_parts!();

    /// [dev] has a guidance embedding, [schnell] none.
    fn embeds_guidance(&self) -> bool {
        self.transformer.config.guidance_embeds
    }

    fn device(&self) -> Device {
        self.transformer.x_embedder.weight.device()
    }

    /// T5 states of `max_sequence_length` tokens, CLIP's pooled output; [dev] adds the guidance
    /// value as the [`GUIDANCE`] extra.
    fn encode_prompts(&self, prompts: &[&str]) -> Result<TextConditioning, ModelError> {
        let encoders = crate::random::built(&self.text, &self.dir)?;
        let kind = self.transformer.x_embedder.weight.kind();
        let device = self.device();
        let (clip_tokenizer, clip) = &encoders.clip;
        let clip_length = clip_tokenizer.model_max_length.unwrap_or(CLIP_LENGTH);
        let ids = clip_tokenizer.encode(prompts, clip_length)?.to_device(clip.store.device());
        let pooled = clip.forward(&ids)?.pooler_output.to_kind(kind).to_device(device);
        let (t5_tokenizer, t5) = &encoders.t5;
        let ids = t5_tokenizer.encode(prompts, self.max_sequence_length)?;
        let embeds = t5.forward(&ids.to_device(t5.store.device()))?.to_kind(kind).to_device(device);
        let mut text = TextConditioning::new(embeds, Some(pooled));
        if self.transformer.config.guidance_embeds {
            let rows = prompts.len() as i64;
            text.extras.insert(
                GUIDANCE.into(),
                Tensor::full([rows], self.guidance, (Kind::Float, device)),
            );
        }
        Ok(text)
    }

    /// `[16, H/8, W/8]`; sides must be multiples of 16 (VAE factor × patch size).
    fn latent_shape(&self, height: i64, width: i64) -> Result<Vec<i64>, ModelError> {
        image_latent_shape(
            height,
            width,
            self.transformer.config.latent_channels(),
            self.vae_scale_factor(),
            PATCH,
        )
    }

    /// Explicit sigmas with the shift μ from the packed token count `(H/2)·(W/2)`.
    fn grid_request(&self, steps: usize, latent_shape: &[i64]) -> GridRequest {
        let tokens = latent_shape[1] / PATCH * (latent_shape[2] / PATCH);
        GridRequest {
            steps,
            pipeline: Pipeline::Flux,
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
