//! The Qwen-Image pipeline: a diffusers `QwenImagePipeline` directory loaded as components, and
//! its prompt encoding, latent layout and schedule.

use std::collections::BTreeMap;
use std::path::Path;

use flowtune_sampling::{GridRequest, Pipeline, SchedulerConfig};
use image::RgbaImage;
use tch::nn::VarStore;
use tch::{Device, Tensor};

use super::{AutoencoderKlQwenImage, QwenImageTransformer, EDIT_PLUS};
use crate::family::{image_latent_shape, pipeline_parts, run_on, FlowPipeline, PipelineOptions};
use crate::pipeline::PipelineDir;
use crate::text_encoders::qwen_edit_prompts::QwenEditPromptEncoder;
use crate::text_encoders::qwen_prompts::QwenPromptEncoder;
use crate::{ModelError, TextConditioning};

/// Text tokens kept per prompt when the options give none (the pipeline's default).
const MAX_SEQUENCE_LENGTH: usize = 512;

/// How prompts are encoded: Qwen-Image's text template, or Qwen-Image-Edit-Plus's with condition
/// pictures through the vision tower.
pub enum QwenText {
    Plain(Box<QwenPromptEncoder>),
    Edit(Box<QwenEditPromptEncoder>),
}

/// Every component of a Qwen-Image (or Qwen-Image-Edit-Plus) pipeline.
pub struct QwenImagePipeline {
    pub dir: PipelineDir,
    pub transformer: QwenImageTransformer,
    pub vae: AutoencoderKlQwenImage,
    /// Qwen2.5-VL with the Qwen2 tokenizer (and, for Edit-Plus, its vision tower and processor);
    /// `None` with random weights ([`crate::StandInText`] encodes).
    pub text: Option<QwenText>,
    pub scheduler: SchedulerConfig,
    /// Text tokens kept per prompt after the template (`max_sequence_length`).
    pub max_sequence_length: usize,
}

impl QwenImagePipeline {
    /// Loads the `QwenImagePipeline` directory at `path`.
    pub fn load(path: &Path, options: &PipelineOptions) -> Result<Self, ModelError> {
        Self::open(PipelineDir::open(path)?, options)
    }

    /// Loads the components of an opened pipeline directory.
    pub fn open(dir: PipelineDir, options: &PipelineOptions) -> Result<Self, ModelError> {
        let (device, dtypes) = (options.device, options.dtypes);
        let scheduler_dir = dir.component("scheduler", &["FlowMatchEulerDiscreteScheduler"])?;
        Ok(Self {
            transformer: QwenImageTransformer::load(
                &dir.component("transformer", &["QwenImageTransformer2DModel"])?,
                device,
                dtypes.transformer,
                options.lora.as_ref(),
            )?,
            vae: AutoencoderKlQwenImage::load(
                &dir.component("vae", &["AutoencoderKLQwenImage"])?,
                options.vae_device(),
                dtypes.vae,
            )?,
            text: crate::random::text_encoders(options, || {
                let encoder =
                    dir.component("text_encoder", &["Qwen2_5_VLForConditionalGeneration"])?;
                let tokenizer = dir.tokenizer("tokenizer")?;
                let (kind, device) = (dtypes.text_encoders, options.encoder_device());
                Ok(if dir.index.class_name == EDIT_PLUS {
                    let processor = dir.root.join("processor");
                    QwenText::Edit(Box::new(QwenEditPromptEncoder::load(
                        &encoder, &tokenizer, &processor, device, kind,
                    )?))
                } else {
                    QwenText::Plain(Box::new(QwenPromptEncoder::load(
                        &encoder, &tokenizer, device, kind,
                    )?))
                })
            })?,
            scheduler: SchedulerConfig::from_file(&scheduler_dir.join("scheduler_config.json"))?,
            max_sequence_length: options.max_sequence_length.unwrap_or(MAX_SEQUENCE_LENGTH),
            dir,
        })
    }

    /// Prompt states and mask as the transformer takes them: its dtype, at most
    /// `max_sequence_length` tokens.
    pub(super) fn conditioning(&self, embeds: Tensor, mask: Tensor) -> TextConditioning {
        let keep = embeds.size()[1].min(self.max_sequence_length as i64);
        let kind = self.transformer.img_in.weight.kind();
        let device = self.device();
        let embeds = embeds.narrow(1, 0, keep).to_kind(kind).to_device(device);
        let mut text = TextConditioning::new(embeds, None);
        text.mask = Some(mask.narrow(1, 0, keep).to_device(device));
        text
    }

    /// Pixels per latent cell on a side.
    pub fn vae_scale_factor(&self) -> i64 {
        self.vae.config.spatial_factor()
    }
}

impl FlowPipeline for QwenImagePipeline {
    pipeline_parts!();

    fn device(&self) -> Device {
        self.transformer.img_in.weight.device()
    }

    /// The chat template around each prompt, Qwen2.5-VL's last hidden states past the template,
    /// rows zero-padded to the longest with a mask.
    fn encode_prompts(&self, prompts: &[&str]) -> Result<TextConditioning, ModelError> {
        match crate::random::built(&self.text, &self.dir)? {
            QwenText::Plain(text) => {
                let (embeds, mask) = text.encode_prompts(prompts, self.max_sequence_length)?;
                Ok(self.conditioning(embeds, mask))
            }
            QwenText::Edit(_) => self.encode_edit(prompts, &[]),
        }
    }

    /// Edit-Plus: the pictures through the vision tower with the prompt, and as VAE tokens.
    fn encode_prompts_with_pictures(
        &self,
        prompts: &[&str],
        pictures: &[RgbaImage],
        _latent_shape: &[i64],
    ) -> Result<TextConditioning, ModelError> {
        let pictures = crate::pictures::opaque_rgb(pictures, &self.dir.index.class_name)?;
        match (crate::random::built(&self.text, &self.dir)?, pictures.is_empty()) {
            (QwenText::Plain(_), true) => self.encode_prompts(prompts),
            _ => self.encode_edit(prompts, &pictures),
        }
    }

    /// Edit-Plus: the pictures' VAE tokens ([`Self::condition_latents`]).
    fn picture_extras(
        &self,
        pictures: &[RgbaImage],
        rows: usize,
    ) -> Result<BTreeMap<String, Tensor>, ModelError> {
        if self.dir.index.class_name != EDIT_PLUS {
            return Err(ModelError::Input(format!(
                "{}: condition pictures need a {EDIT_PLUS}, this is a {}",
                self.dir.root.display(),
                self.dir.index.class_name
            )));
        }
        let pictures = crate::pictures::opaque_rgb(pictures, &self.dir.index.class_name)?;
        Ok(self.condition_latents(&pictures, rows))
    }

    fn default_negative_prompt(&self) -> &'static str {
        " "
    }

    /// `[16, H/8, W/8]`; sides must be multiples of 16 (VAE factor × patch size).
    fn latent_shape(&self, height: i64, width: i64) -> Result<Vec<i64>, ModelError> {
        let patch = self.transformer.config.patch_size;
        image_latent_shape(
            height,
            width,
            self.transformer.config.latent_channels(),
            self.vae_scale_factor(),
            patch,
        )
    }

    /// Dynamic shifting from the packed token count `(H/2)·(W/2)` of the latent.
    fn grid_request(&self, steps: usize, latent_shape: &[i64]) -> GridRequest {
        let p = self.transformer.config.patch_size;
        let tokens = latent_shape[1] / p * (latent_shape[2] / p);
        GridRequest {
            steps,
            pipeline: Pipeline::QwenImage,
            image_seq_len: Some(tokens as u64),
            ..Default::default()
        }
    }

    fn decode_rgb8(&self, latents: &Tensor) -> Result<Tensor, ModelError> {
        let decode = |l: &Tensor| AutoencoderKlQwenImage::to_rgb8(&self.vae.decode(l));
        Ok(run_on(self.vae.store.device(), latents, decode))
    }

    fn encode_rgb8(&self, images: &Tensor) -> Result<Tensor, ModelError> {
        let encode = |i: &Tensor| {
            let pixels = i.permute([0, 3, 1, 2]).to_kind(tch::Kind::Float) / 127.5 - 1.0;
            self.vae.encode(&pixels).0.to_kind(tch::Kind::Float)
        };
        Ok(run_on(self.vae.store.device(), images, encode))
    }

    fn trained_stores(&self) -> Vec<(&'static str, &'static str, &VarStore)> {
        vec![("transformer", "diffusion_pytorch_model.safetensors", &self.transformer.weights.base)]
    }
}
