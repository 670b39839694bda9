//! The Qwen-Image 2.1 pipeline: a diffusers `QwenImage21Pipeline` directory loaded as components,
//! its prompt encoding (the raw chat template with the system prompt, Qwen3-VL's language model,
//! the last layer's states before the final norm, the system tokens dropped, right-padded with a
//! mask), latent layout and the author-set sampling sigmas (`sample_sigmas`).
//!
//! Condition images (`image=`: they need Qwen3-VL's vision tower) are refused by name. The
//! pipeline encodes whole prompts: `max_sequence_length` is not read.

use std::path::Path;

use flowtune_sampling::{GridRequest, Pipeline, SchedulerConfig};
use image::RgbImage;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::{AutoencoderKlQwenImage21, QwenImage21Transformer};
use crate::family::{image_latent_shape, pipeline_parts, run_on, FlowPipeline, PipelineOptions};
use crate::pipeline::PipelineDir;
use crate::text_encoders::qwen3::Qwen3TextEncoder;
use crate::tokenizer::TextTokenizer;
use crate::vae::AutoencoderKl;
use crate::{read_config, ModelError, TextConditioning};

/// The pipeline's system prompt, in the system turn every prompt starts with.
const SYSTEM_TURN: &str =
    "<|im_start|>system\nComprehend and analyze the provided prompt.<|im_end|>\n";
/// The user turn around a prompt, then the assistant's opening (`prompt_template_t2i`).
const USER_TURN: (&str, &str) = ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n");
/// The VAE's spatial factor the pipeline assumes (`vae_scale_factor`).
const VAE_FACTOR: i64 = 16;

/// Qwen3-VL's language model with the processor's tokenizer.
pub struct QwenImage21PromptEncoder {
    pub encoder: Qwen3TextEncoder,
    pub tokenizer: TextTokenizer,
    /// Leading tokens dropped from the states: the system turn's (`_drop_idx`).
    pub drop: usize,
}

impl QwenImage21PromptEncoder {
    /// Loads `text_encoder/` (a `Qwen3VLForConditionalGeneration`) and the tokenizer of
    /// `processor/`; an encoder narrower than the transformer's `context_in_dim` is refused
    /// naming its `config.json`.
    pub fn load(
        dir: &PipelineDir,
        options: &PipelineOptions,
        context_in_dim: i64,
    ) -> Result<Self, ModelError> {
        let encoder_dir = dir.component("text_encoder", &["Qwen3VLForConditionalGeneration"])?;
        let kind = options.dtypes.text_encoders;
        let encoder = Qwen3TextEncoder::load_vl(&encoder_dir, options.encoder_device(), kind)?;
        if encoder.hidden_size() != context_in_dim {
            return Err(ModelError::Input(format!(
                "{}: hidden_size {} differs from the transformer's context_in_dim {context_in_dim}",
                encoder_dir.join("config.json").display(),
                encoder.hidden_size()
            )));
        }
        let tokenizer = TextTokenizer::load(&dir.tokenizer("processor")?)?;
        let drop = tokenizer.ids(SYSTEM_TURN)?.len();
        Ok(Self { encoder, tokenizer, drop })
    }

    /// The token ids of `prompt` in the template (an empty prompt reads `" "`, as the pipeline).
    pub fn ids(&self, prompt: &str) -> Result<Vec<u32>, ModelError> {
        let prompt = if prompt.is_empty() { " " } else { prompt };
        self.tokenizer.ids(&format!("{SYSTEM_TURN}{}{prompt}{}", USER_TURN.0, USER_TURN.1))
    }

    /// (B, L, hidden) states of each prompt's tokens after the system turn, right-padded with
    /// zeros to the longest, and their mask (B, L) (ones on tokens), `None` when no row is
    /// padded, as `encode_prompt` returns them.
    pub fn encode(&self, prompts: &[&str]) -> Result<(Tensor, Option<Tensor>), ModelError> {
        if prompts.is_empty() {
            return Err(ModelError::Input("Qwen-Image 2.1 prompt encoding needs a prompt".into()));
        }
        let device = self.encoder.store.device();
        let mut rows = vec![];
        for prompt in prompts {
            let ids: Vec<i64> = self.ids(prompt)?.into_iter().map(i64::from).collect();
            let n = ids.len() as i64;
            let ids = Tensor::from_slice(&ids).to_device(device).unsqueeze(0);
            let states = self.encoder.last_layer(&ids, &ids.ones_like())?.squeeze_dim(0);
            rows.push(states.narrow(0, self.drop as i64, n - self.drop as i64));
        }
        let longest = rows.iter().map(|r| r.size()[0]).max().expect("one row");
        let mask: Vec<Tensor> = rows
            .iter()
            .map(|r| {
                let ones = Tensor::ones([r.size()[0]], (Kind::Int64, device));
                ones.constant_pad_nd([0, longest - r.size()[0]])
            })
            .collect();
        let embeds: Vec<Tensor> =
            rows.iter().map(|r| r.constant_pad_nd([0, 0, 0, longest - r.size()[0]])).collect();
        let padded = rows.iter().any(|r| r.size()[0] < longest);
        Ok((Tensor::stack(&embeds, 0), padded.then(|| Tensor::stack(&mask, 0))))
    }
}

/// Every component of a Qwen-Image 2.1 pipeline.
pub struct QwenImage21Pipeline {
    pub dir: PipelineDir,
    pub transformer: QwenImage21Transformer,
    pub vae: AutoencoderKlQwenImage21,
    pub text: QwenImage21PromptEncoder,
    pub scheduler: SchedulerConfig,
    /// The author's sampling sigmas of `model_index.json` (without the terminal 0), used when a
    /// run samples their count of steps.
    pub sample_sigmas: Option<Vec<f64>>,
}

impl QwenImage21Pipeline {
    /// Loads the `QwenImage21Pipeline` directory at `path`.
    pub fn load(path: &Path, options: &PipelineOptions) -> Result<Self, ModelError> {
        Self::open(PipelineDir::open(path)?, options)
    }

    /// Loads the components of an opened pipeline directory.
    pub fn open(dir: PipelineDir, options: &PipelineOptions) -> Result<Self, ModelError> {
        let index = dir.root.join("model_index.json");
        let (device, dtypes) = (options.device, options.dtypes);
        let raw: serde_json::Value = read_config(&index)?;
        let sample_sigmas = match &raw["sample_sigmas"] {
            serde_json::Value::Null => None,
            value => {
                Some(serde_json::from_value(value.clone()).map_err(|e| ModelError::Format {
                    path: index.display().to_string(),
                    message: format!("sample_sigmas: {e}"),
                })?)
            }
        };
        let scheduler_dir = dir.component("scheduler", &["FlowMatchEulerDiscreteScheduler"])?;
        let transformer = QwenImage21Transformer::load(
            &dir.component("transformer", &["QwenImage21Transformer2DModel"])?,
            device,
            dtypes.transformer,
            options.lora.as_ref(),
        )?;
        let vae_dir = dir.component("vae", &["AutoencoderKLQwenImage21"])?;
        let vae = AutoencoderKlQwenImage21::load(&vae_dir, options.vae_device(), dtypes.vae)?;
        let (spatial, z) = (vae.config.spatial_factor(), vae.config.z_dim);
        if spatial != VAE_FACTOR || z != transformer.config.in_channels {
            return Err(ModelError::Input(format!(
                "{}: a {spatial}× VAE with z_dim {z}; the pipeline assumes 16× and the \
                 transformer reads {} channels",
                vae_dir.join("config.json").display(),
                transformer.config.in_channels
            )));
        }
        let text =
            QwenImage21PromptEncoder::load(&dir, options, transformer.config.context_in_dim)?;
        Ok(Self {
            vae,
            text,
            scheduler: SchedulerConfig::from_file(&scheduler_dir.join("scheduler_config.json"))?,
            sample_sigmas,
            transformer,
            dir,
        })
    }
}

impl FlowPipeline for QwenImage21Pipeline {
    pipeline_parts!();

    fn device(&self) -> Device {
        self.transformer.img_in.weight.device()
    }

    /// The prompts' states with their mask (`None` when no row is padded).
    fn encode_prompts(&self, prompts: &[&str]) -> Result<TextConditioning, ModelError> {
        let (embeds, mask) = self.text.encode(prompts)?;
        let (kind, device) = (self.transformer.img_in.weight.kind(), self.device());
        let mut text = TextConditioning::new(embeds.to_kind(kind).to_device(device), None);
        text.mask = mask.map(|m| m.to_device(device));
        Ok(text)
    }

    /// Condition images are refused: the pipeline encodes them with Qwen3-VL's vision tower,
    /// which flowtune does not run.
    fn encode_prompts_with_pictures(
        &self,
        prompts: &[&str],
        pictures: &[RgbImage],
        _latent_shape: &[i64],
    ) -> Result<TextConditioning, ModelError> {
        if pictures.is_empty() {
            return self.encode_prompts(prompts);
        }
        Err(ModelError::Input(format!(
            "{}: QwenImage21Pipeline's condition images (image=) are not supported: the pipeline \
             encodes them with Qwen3-VL's vision tower, which flowtune does not run",
            self.dir.root.display()
        )))
    }

    /// `[C, H/16, W/16]`, one token per latent cell; sides must be multiples of 32 (one encoder
    /// slot per 2×2 tokens).
    fn latent_shape(&self, height: i64, width: i64) -> Result<Vec<i64>, ModelError> {
        image_latent_shape(height, width, self.transformer.config.in_channels, VAE_FACTOR, 2)
    }

    /// The author's `sample_sigmas` when the pipeline has them and `steps` is their count (the
    /// pipeline's default sampling), else `linspace(1, 1/N, N)` (the pipeline without them: a
    /// recipe's step count is never overridden); μ from the target's token count.
    fn grid_request(&self, steps: usize, latent_shape: &[i64]) -> GridRequest {
        GridRequest {
            steps,
            pipeline: Pipeline::QwenImage,
            image_seq_len: Some((latent_shape[1] * latent_shape[2]) as u64),
            sigmas: self.sample_sigmas.clone().filter(|s| s.len() == steps),
        }
    }

    /// RGB of the decoded pictures (an RGBA VAE's alpha is dropped).
    fn decode_rgb8(&self, latents: &Tensor) -> Result<Tensor, ModelError> {
        Ok(run_on(self.vae.store.device(), latents, |l| {
            AutoencoderKl::to_rgb8(&self.vae.decode(l).narrow(1, 0, 3))
        }))
    }

    /// Opaque pictures (alpha 255 for an RGBA VAE, as the pipeline converts them) to latents.
    fn encode_rgb8(&self, images: &Tensor) -> Result<Tensor, ModelError> {
        Ok(run_on(self.vae.store.device(), images, |i| {
            let mut x = i.permute([0, 3, 1, 2]).to_kind(Kind::Float) / 127.5 - 1.0;
            if self.vae.config.in_channels == 4 {
                x = Tensor::cat(&[x.shallow_clone(), x.narrow(1, 0, 1).ones_like()], 1);
            }
            self.vae.encode(&x).to_kind(Kind::Float)
        }))
    }

    fn trained_stores(&self) -> Vec<(&'static str, &'static str, &VarStore)> {
        vec![("transformer", "diffusion_pytorch_model.safetensors", &self.transformer.weights.base)]
    }
}
