//! The FLUX.2 pipelines: a diffusers `Flux2KleinPipeline` ([klein], Qwen3) or `Flux2Pipeline`
//! ([dev], Mistral Small 3) directory loaded as components, and its prompt encoding (the
//! encoder's chat template, padded to `max_sequence_length`, hidden states of three layers side by
//! side), reference images, distilled guidance ([dev]), latent layout and schedule.

use std::collections::BTreeMap;
use std::path::Path;

use flowtune_sampling::{GridRequest, Pipeline, SchedulerConfig};
use image::RgbaImage;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::{reference_tokens, Flux2Transformer, Flux2Vae, REFERENCE_IDS, REFERENCE_TOKENS};
use crate::family::{image_latent_shape, pipeline_parts, run_on, FlowPipeline, PipelineOptions};
use crate::flux::GUIDANCE;
use crate::pipeline::PipelineDir;
use crate::text_encoders::mistral3::Mistral3TextEncoder;
use crate::text_encoders::qwen3::Qwen3TextEncoder;
use crate::tokenizer::TextTokenizer;
use crate::z_image::TEXT_ENCODER_CLASSES;
use crate::{read_config, ModelError, TextConditioning};

/// Text tokens per prompt when the options give none (the pipeline's `max_sequence_length`).
const MAX_SEQUENCE_LENGTH: usize = 512;
/// The distilled guidance of [dev] when the options give none (`Flux2Pipeline`'s
/// `guidance_scale` default).
const DEFAULT_GUIDANCE: f64 = 4.0;
/// The Qwen3 hidden states stacked into [klein]'s text tokens (the pipeline's
/// `text_encoder_out_layers` default).
pub const TEXT_LAYERS: [usize; 3] = [9, 18, 27];
/// The Mistral hidden states stacked into [dev]'s text tokens.
pub const MISTRAL_TEXT_LAYERS: [usize; 3] = [10, 20, 30];
/// Qwen3's chat template for one user message with `add_generation_prompt=True,
/// enable_thinking=False`, as `Flux2KleinPipeline` applies it.
pub const CHAT_TEMPLATE: &str =
    "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
/// The system turn `Flux2Pipeline` puts before every prompt.
pub const SYSTEM_MESSAGE: &str = "You are an AI that reasons about image descriptions. You give \
    structured responses focusing on object relationships, object\nattribution and actions \
    without speculation.";

/// The text model of either variant.
pub enum Flux2TextModel {
    /// [klein]: Qwen3, layers [`TEXT_LAYERS`].
    Qwen3(Qwen3TextEncoder),
    /// [dev]: Mistral3's language model, layers [`MISTRAL_TEXT_LAYERS`].
    Mistral3(Mistral3TextEncoder),
}

impl Flux2TextModel {
    fn layers(&self) -> [usize; 3] {
        match self {
            Self::Qwen3(_) => TEXT_LAYERS,
            Self::Mistral3(_) => MISTRAL_TEXT_LAYERS,
        }
    }

    fn shape(&self) -> (usize, i64) {
        match self {
            Self::Qwen3(m) => (m.num_layers(), m.hidden_size()),
            Self::Mistral3(m) => (m.num_layers(), m.hidden_size()),
        }
    }

    fn device(&self) -> Device {
        match self {
            Self::Qwen3(m) => m.store.device(),
            Self::Mistral3(m) => m.store.device(),
        }
    }
}

/// The text encoder with its tokenizer.
pub struct Flux2PromptEncoder {
    pub encoder: Flux2TextModel,
    pub tokenizer: TextTokenizer,
}

impl Flux2PromptEncoder {
    /// Loads `text_encoder/` and `tokenizer/` of `dir` (Qwen3 for [klein], Mistral3 for [dev]);
    /// an encoder shallower than its deepest read layer, or whose stacked states are not
    /// `joint_attention_dim` wide, is refused naming its `config.json`.
    pub fn load(
        dir: &PipelineDir,
        options: &PipelineOptions,
        joint_attention_dim: i64,
    ) -> Result<Self, ModelError> {
        let kind = options.dtypes.text_encoders;
        let device = options.encoder_device();
        let (encoder_dir, encoder) = if dir.index.class_name == "Flux2Pipeline" {
            let encoder_dir =
                dir.component("text_encoder", &["Mistral3ForConditionalGeneration"])?;
            let model = Mistral3TextEncoder::load(&encoder_dir, device, kind)?;
            (encoder_dir, Flux2TextModel::Mistral3(model))
        } else {
            let encoder_dir = dir.component("text_encoder", TEXT_ENCODER_CLASSES)?;
            let model = Qwen3TextEncoder::load(&encoder_dir, device, kind)?;
            (encoder_dir, Flux2TextModel::Qwen3(model))
        };
        let config = encoder_dir.join("config.json");
        let ((count, hidden), layers) = (encoder.shape(), encoder.layers());
        if count < layers[layers.len() - 1] {
            return Err(ModelError::Input(format!(
                "{}: {count} layers; the pipeline reads the hidden states of layers {layers:?}",
                config.display()
            )));
        }
        let width = layers.len() as i64 * hidden;
        if width != joint_attention_dim {
            return Err(ModelError::Input(format!(
                "{}: {} layers of width {hidden} give {width} channels; the transformer's \
                 joint_attention_dim is {joint_attention_dim}",
                config.display(),
                layers.len()
            )));
        }
        Ok(Self { encoder, tokenizer: TextTokenizer::load(&dir.tokenizer("tokenizer")?)? })
    }

    /// Token ids and mask (B, `length`) of `prompts` in the encoder's chat template, truncated
    /// and padded to `length` on the tokenizer's side: Qwen3's user turn ([klein]); Mistral's
    /// beginning of text, [`SYSTEM_MESSAGE`] and the user turn without `[IMG]` ([dev]).
    pub fn tokenize(
        &self,
        prompts: &[&str],
        length: usize,
    ) -> Result<(Tensor, Tensor), ModelError> {
        match self.encoder {
            Flux2TextModel::Qwen3(_) => {
                let texts: Vec<String> =
                    prompts.iter().map(|p| CHAT_TEMPLATE.replace("{}", p)).collect();
                let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
                self.tokenizer.encode_with_mask(&texts, length)
            }
            Flux2TextModel::Mistral3(_) => {
                let texts: Vec<String> = prompts
                    .iter()
                    .map(|p| {
                        format!(
                            "<s>[SYSTEM_PROMPT]{SYSTEM_MESSAGE}[/SYSTEM_PROMPT][INST]{}[/INST]",
                            p.replace("[IMG]", "")
                        )
                    })
                    .collect();
                let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
                self.tokenizer.encode_rendered_with_mask(&texts, length)
            }
        }
    }

    /// (B, `length`, 3·hidden): the three read layers' states of every token, padding included
    /// (the transformer attends to all of them), side by side.
    pub fn encode(&self, prompts: &[&str], length: usize) -> Result<Tensor, ModelError> {
        if prompts.is_empty() || length == 0 {
            return Err(ModelError::Input(format!(
                "FLUX.2 prompt encoding needs at least one prompt and max_sequence_length ≥ 1, \
                 got {} prompts and {length}",
                prompts.len()
            )));
        }
        let (ids, mask) = self.tokenize(prompts, length)?;
        let device = self.encoder.device();
        let (ids, mask) = (ids.to_device(device), mask.to_device(device));
        let layers = self.encoder.layers();
        let states = match &self.encoder {
            Flux2TextModel::Qwen3(m) => m.hidden_states(&ids, &mask, &layers)?,
            Flux2TextModel::Mistral3(m) => m.hidden_states(&ids, &mask, &layers)?,
        };
        Ok(Tensor::cat(&states, 2))
    }
}

/// Every component of a FLUX.2 [klein] or [dev] pipeline.
pub struct Flux2Pipeline {
    pub dir: PipelineDir,
    pub transformer: Flux2Transformer,
    pub vae: Flux2Vae,
    /// `None` with random weights ([`crate::StandInText`] encodes).
    pub text: Option<Flux2PromptEncoder>,
    pub scheduler: SchedulerConfig,
    /// Text tokens per prompt (`max_sequence_length`).
    pub max_sequence_length: usize,
    /// The distilled guidance value [dev] is conditioned on (unused by [klein]).
    pub guidance: f64,
}

impl Flux2Pipeline {
    /// Loads the `Flux2KleinPipeline` or `Flux2Pipeline` directory at `path`.
    pub fn load(path: &Path, options: &PipelineOptions) -> Result<Self, ModelError> {
        Self::open(PipelineDir::open(path)?, options)
    }

    /// Loads the components of an opened pipeline directory.
    pub fn open(dir: PipelineDir, options: &PipelineOptions) -> Result<Self, ModelError> {
        let index = dir.root.join("model_index.json");
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
        let width = transformer.config.joint_attention_dim;
        let text = crate::random::text_encoders(options, || {
            Flux2PromptEncoder::load(&dir, options, width)
        })?;
        let vae_dir = dir.component("vae", &["AutoencoderKLFlux2"])?;
        let vae = Flux2Vae::load(&vae_dir, options.vae_device(), dtypes.vae)?;
        let (tokens, latent) = (transformer.config.in_channels, vae.config.latent_channels);
        if tokens != 4 * latent {
            return Err(ModelError::Input(format!(
                "{}: latent_channels {latent} make 2×2 patches of {} channels; the transformer's \
                 in_channels is {tokens}",
                vae_dir.join("config.json").display(),
                4 * latent
            )));
        }
        Ok(Self {
            vae,
            text,
            scheduler: SchedulerConfig::from_file(&scheduler_dir.join("scheduler_config.json"))?,
            max_sequence_length: options.max_sequence_length.unwrap_or(MAX_SEQUENCE_LENGTH),
            guidance: options.embedded_guidance.unwrap_or(DEFAULT_GUIDANCE),
            transformer,
            dir,
        })
    }
}

impl FlowPipeline for Flux2Pipeline {
    pipeline_parts!();

    /// [dev] has a guidance embedding, [klein] none.
    fn embeds_guidance(&self) -> bool {
        self.transformer.config.guidance_embeds
    }

    fn device(&self) -> Device {
        self.transformer.x_embedder.weight.device()
    }

    /// The text encoder's states of `max_sequence_length` tokens per prompt; no mask. [dev]
    /// adds the guidance value as the [`GUIDANCE`] extra.
    fn encode_prompts(&self, prompts: &[&str]) -> Result<TextConditioning, ModelError> {
        let encoder = crate::random::built(&self.text, &self.dir)?;
        let embeds = encoder.encode(prompts, self.max_sequence_length)?;
        let kind = self.transformer.x_embedder.weight.kind();
        let device = self.device();
        let mut text = TextConditioning::new(embeds.to_kind(kind).to_device(device), None);
        if self.transformer.config.guidance_embeds {
            let rows = prompts.len() as i64;
            let guidance = Tensor::full([rows], self.guidance, (Kind::Float, device));
            text.extras.insert(GUIDANCE.into(), guidance);
        }
        Ok(text)
    }

    /// The prompts with every row sharing the reference `pictures` (the pipeline's `image`):
    /// their tokens and ids ride as the [`REFERENCE_TOKENS`] and [`REFERENCE_IDS`] extras.
    fn encode_prompts_with_pictures(
        &self,
        prompts: &[&str],
        pictures: &[RgbaImage],
        _latent_shape: &[i64],
    ) -> Result<TextConditioning, ModelError> {
        let mut text = self.encode_prompts(prompts)?;
        if !pictures.is_empty() {
            text.extras.extend(self.picture_extras(pictures, prompts.len())?);
        }
        Ok(text)
    }

    /// The reference pictures' tokens and ids, one copy per row; the prompt does not see them.
    fn picture_extras(
        &self,
        pictures: &[RgbaImage],
        rows: usize,
    ) -> Result<BTreeMap<String, Tensor>, ModelError> {
        let pictures = crate::pictures::opaque_rgb(pictures, &self.dir.index.class_name)?;
        let (tokens, ids) = reference_tokens(&self.vae, &pictures)?;
        let (rows, device) = (rows as i64, self.device());
        Ok(BTreeMap::from([
            (REFERENCE_TOKENS.into(), tokens.to_device(device).repeat([rows, 1, 1])),
            (REFERENCE_IDS.into(), ids.to_device(device).repeat([rows, 1, 1])),
        ]))
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
