//! The FLUX.2 [klein] pipeline: a diffusers `Flux2KleinPipeline` directory loaded as components,
//! and its prompt encoding (Qwen3 chat template without thinking, padded to
//! `max_sequence_length`, hidden states of three layers side by side), reference images, latent
//! layout and schedule.
//! `Flux2Pipeline` ([dev], a Mistral3 text encoder) is refused by name.

use std::path::Path;

use flowtune_sampling::{GridRequest, Pipeline, SchedulerConfig};
use image::RgbImage;
use tch::nn::VarStore;
use tch::{Device, Tensor};

use super::{reference_tokens, Flux2Transformer, Flux2Vae, REFERENCE_IDS, REFERENCE_TOKENS};
use crate::family::{image_latent_shape, pipeline_parts, run_on, FlowPipeline, PipelineOptions};
use crate::pipeline::PipelineDir;
use crate::text_encoders::qwen3::Qwen3TextEncoder;
use crate::tokenizer::TextTokenizer;
use crate::z_image::TEXT_ENCODER_CLASSES;
use crate::{read_config, ModelError, TextConditioning};

/// Text tokens per prompt when the options give none (the pipeline's `max_sequence_length`).
const MAX_SEQUENCE_LENGTH: usize = 512;
/// The Qwen3 hidden states stacked into the text tokens (the pipeline's
/// `text_encoder_out_layers` default).
pub const TEXT_LAYERS: [usize; 3] = [9, 18, 27];
/// Qwen3's chat template for one user message with `add_generation_prompt=True,
/// enable_thinking=False`, as `Flux2KleinPipeline` applies it.
pub const CHAT_TEMPLATE: &str =
    "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";

/// Qwen3 with its tokenizer.
pub struct Flux2PromptEncoder {
    pub encoder: Qwen3TextEncoder,
    pub tokenizer: TextTokenizer,
}

impl Flux2PromptEncoder {
    /// Loads `text_encoder/` and `tokenizer/` of `dir`; an encoder without layer 27, or whose
    /// stacked states are not `joint_attention_dim` wide, is refused naming its `config.json`.
    pub fn load(
        dir: &PipelineDir,
        options: &PipelineOptions,
        joint_attention_dim: i64,
    ) -> Result<Self, ModelError> {
        let encoder_dir = dir.component("text_encoder", TEXT_ENCODER_CLASSES)?;
        let config = encoder_dir.join("config.json");
        let kind = options.dtypes.text_encoders;
        let encoder = Qwen3TextEncoder::load(&encoder_dir, options.encoder_device(), kind)?;
        let (layers, hidden) = (encoder.num_layers(), encoder.hidden_size());
        if layers < TEXT_LAYERS[TEXT_LAYERS.len() - 1] {
            return Err(ModelError::Input(format!(
                "{}: {layers} layers; the pipeline reads the hidden states of layers \
                 {TEXT_LAYERS:?}",
                config.display()
            )));
        }
        let width = TEXT_LAYERS.len() as i64 * hidden;
        if width != joint_attention_dim {
            return Err(ModelError::Input(format!(
                "{}: {} Qwen3 layers of width {hidden} give {width} channels; the transformer's \
                 joint_attention_dim is {joint_attention_dim}",
                config.display(),
                TEXT_LAYERS.len()
            )));
        }
        Ok(Self { encoder, tokenizer: TextTokenizer::load(&dir.tokenizer("tokenizer")?)? })
    }

    /// Token ids and mask (B, `length`) of `prompts` in the chat template, truncated and
    /// right-padded to `length`.
    pub fn tokenize(
        &self,
        prompts: &[&str],
        length: usize,
    ) -> Result<(Tensor, Tensor), ModelError> {
        let texts: Vec<String> = prompts.iter().map(|p| CHAT_TEMPLATE.replace("{}", p)).collect();
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        self.tokenizer.encode_with_mask(&texts, length)
    }

    /// (B, `length`, 3·hidden): the [`TEXT_LAYERS`] states of every token, padding included (the
    /// transformer attends to all of them), side by side.
    pub fn encode(&self, prompts: &[&str], length: usize) -> Result<Tensor, ModelError> {
        if prompts.is_empty() || length == 0 {
            return Err(ModelError::Input(format!(
                "FLUX.2 prompt encoding needs at least one prompt and max_sequence_length ≥ 1, \
                 got {} prompts and {length}",
                prompts.len()
            )));
        }
        let (ids, mask) = self.tokenize(prompts, length)?;
        let device = self.encoder.store.device();
        let states = self.encoder.hidden_states(
            &ids.to_device(device),
            &mask.to_device(device),
            &TEXT_LAYERS,
        )?;
        Ok(Tensor::cat(&states, 2))
    }
}

/// Every component of a FLUX.2 [klein] pipeline.
pub struct Flux2KleinPipeline {
    pub dir: PipelineDir,
    pub transformer: Flux2Transformer,
    pub vae: Flux2Vae,
    pub text: Flux2PromptEncoder,
    pub scheduler: SchedulerConfig,
    /// Text tokens per prompt (`max_sequence_length`).
    pub max_sequence_length: usize,
}

impl Flux2KleinPipeline {
    /// Loads the `Flux2KleinPipeline` directory at `path`.
    pub fn load(path: &Path, options: &PipelineOptions) -> Result<Self, ModelError> {
        Self::open(PipelineDir::open(path)?, options)
    }

    /// Loads the components of an opened pipeline directory.
    pub fn open(dir: PipelineDir, options: &PipelineOptions) -> Result<Self, ModelError> {
        let index = dir.root.join("model_index.json");
        if dir.index.class_name != "Flux2KleinPipeline" {
            return Err(ModelError::Input(format!(
                "{}: {} (FLUX.2 [dev]) is not supported: its text encoder is a \
                 Mistral3ForConditionalGeneration; FLUX.2 [klein] (Flux2KleinPipeline, Qwen3) is",
                index.display(),
                dir.index.class_name
            )));
        }
        let (device, dtypes) = (options.device, options.dtypes);
        let raw: serde_json::Value = read_config(&index)?;
        let scheduler_dir = dir.component("scheduler", &["FlowMatchEulerDiscreteScheduler"])?;
        let mut transformer = Flux2Transformer::load(
            &dir.component("transformer", &["Flux2Transformer2DModel"])?,
            device,
            dtypes.transformer,
            options.lora.as_ref(),
        )?;
        transformer.config.is_distilled = raw["is_distilled"].as_bool().unwrap_or(false);
        let text = Flux2PromptEncoder::load(&dir, options, transformer.config.joint_attention_dim)?;
        Ok(Self {
            vae: Flux2Vae::load(
                &dir.component("vae", &["AutoencoderKLFlux2"])?,
                options.vae_device(),
                dtypes.vae,
            )?,
            text,
            scheduler: SchedulerConfig::from_file(&scheduler_dir.join("scheduler_config.json"))?,
            max_sequence_length: options.max_sequence_length.unwrap_or(MAX_SEQUENCE_LENGTH),
            transformer,
            dir,
        })
    }
}

impl FlowPipeline for Flux2KleinPipeline {
    pipeline_parts!();

    fn device(&self) -> Device {
        self.transformer.x_embedder.weight.device()
    }

    /// The Qwen3 states of `max_sequence_length` tokens per prompt; no mask.
    fn encode_prompts(&self, prompts: &[&str]) -> Result<TextConditioning, ModelError> {
        let embeds = self.text.encode(prompts, self.max_sequence_length)?;
        let kind = self.transformer.x_embedder.weight.kind();
        Ok(TextConditioning::new(embeds.to_kind(kind).to_device(self.device()), None))
    }

    /// The prompts with every row sharing the reference `pictures` (the pipeline's `image`):
    /// their tokens and ids ride as the [`REFERENCE_TOKENS`] and [`REFERENCE_IDS`] extras.
    fn encode_prompts_with_pictures(
        &self,
        prompts: &[&str],
        pictures: &[RgbImage],
        _latent_shape: &[i64],
    ) -> Result<TextConditioning, ModelError> {
        let mut text = self.encode_prompts(prompts)?;
        if pictures.is_empty() {
            return Ok(text);
        }
        let (tokens, ids) = reference_tokens(&self.vae, pictures)?;
        let rows = prompts.len() as i64;
        let device = self.device();
        text.extras.insert(REFERENCE_TOKENS.into(), tokens.to_device(device).repeat([rows, 1, 1]));
        text.extras.insert(REFERENCE_IDS.into(), ids.to_device(device).repeat([rows, 1, 1]));
        Ok(text)
    }

    /// `[4·C, H/2f, W/2f]` (2×2 patches of the VAE latent, f the VAE factor: 8 released); sides
    /// must be multiples of 2f.
    fn latent_shape(&self, height: i64, width: i64) -> Result<Vec<i64>, ModelError> {
        let channels = self.transformer.config.in_channels;
        image_latent_shape(height, width, channels, self.vae.scale_factor(), 1)
    }

    /// Explicit sigmas with FLUX.2's empirical μ of the latent token count.
    fn grid_request(&self, steps: usize, latent_shape: &[i64]) -> GridRequest {
        GridRequest {
            steps,
            pipeline: Pipeline::Flux2,
            image_seq_len: Some((latent_shape[1] * latent_shape[2]) as u64),
            ..Default::default()
        }
    }

    fn decode_rgb8(&self, latents: &Tensor) -> Result<Tensor, ModelError> {
        Ok(run_on(self.vae.autoencoder.store.device(), latents, |l| self.vae.decode_rgb8(l)))
    }

    fn encode_rgb8(&self, images: &Tensor) -> Result<Tensor, ModelError> {
        Ok(run_on(self.vae.autoencoder.store.device(), images, |i| self.vae.encode_rgb8(i)))
    }

    fn trained_stores(&self) -> Vec<(&'static str, &'static str, &VarStore)> {
        vec![("transformer", "diffusion_pytorch_model.safetensors", &self.transformer.weights.base)]
    }
}
