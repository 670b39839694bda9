//! The Qwen-Image 2.1 pipeline: a diffusers `QwenImage21Pipeline` directory loaded as components,
//! its prompt encoding (the raw chat template with the system prompt, Qwen3-VL's language model,
//! the last layer's states before the final norm, the system tokens dropped, right-padded with a
//! mask), condition images, latent layout and the author-set sampling sigmas (`sample_sigmas`).
//!
//! Condition images (`image=`) are resized once (Pillow's Lanczos through premultiplied alpha, as
//! the pipeline) to `output_resolution`² pixels at their own aspect ratio (diffusers'
//! `calculate_dimensions`; the pipeline's argument, default 1024, whatever the target's size).
//! That picture fills the vision slots of the `ti2i` template
//! (`<imageN><|vision_start|><|image_pad|>…<|vision_end|>`, through Qwen3-VL's image processor and
//! vision tower, deepstack and 3-D positions) composited over white, and is VAE-encoded with its
//! alpha into the condition tokens the transformer reads before the target's. The pipeline
//! encodes whole prompts: `max_sequence_length` is not read.

use std::path::Path;

use flowtune_sampling::{GridRequest, Pipeline, SchedulerConfig};
use image::{RgbImage, RgbaImage};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::{AutoencoderKlQwenImage21, QwenImage21Transformer, IMAGE_SLOTS};
use crate::condition_sizes::{marker_tokens, tokenizer_in, ConditionSizes};
use crate::family::{image_latent_shape, pipeline_parts, run_on, FlowPipeline, PipelineOptions};
use crate::pipeline::PipelineDir;
use crate::qwen_image::{calculate_dimensions, CONDITION_LATENTS, CONDITION_SHAPES};
use crate::resize::{over_white, resize_rgba, Filter};
use crate::text_encoders::qwen2_vl_processor::Qwen2VlImageProcessor;
use crate::text_encoders::qwen3_vl::Qwen3VlEncoder;
use crate::tokenizer::TextTokenizer;
use crate::vae::AutoencoderKl;
use crate::{read_config, ModelError, TextConditioning};

/// The pipeline's system prompt, in the system turn every prompt starts with.
const SYSTEM_TURN: &str =
    "<|im_start|>system\nComprehend and analyze the provided prompt.<|im_end|>\n";
/// The user turn around a prompt, then the assistant's opening (`prompt_template_t2i`).
const USER_TURN: (&str, &str) = ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n");
/// The image placeholder the processor expands to one token per merged patch.
const IMAGE_PAD: &str = "<|image_pad|>";
/// The VAE's spatial factor the pipeline assumes (`vae_scale_factor`).
const VAE_FACTOR: i64 = 16;
/// `__call__`'s default `output_resolution`.
pub const DEFAULT_OUTPUT_RESOLUTION: i64 = 1024;

/// What condition pictures of (width, height) add ([`crate::condition_sizes`]): each resized to
/// `output_resolution`² pixels at its aspect ratio and VAE-encoded as image-stream tokens, and one
/// vision slot per 2 × 2 of its latent cells, with its words and markers
/// (`<image1><|vision_start|>…<|vision_end|>`, in the folder's tokenizer), in the prompt.
pub fn condition_sizes(
    dir: &PipelineDir,
    rows: &[Vec<(u32, u32)>],
    output_resolution: Option<u32>,
) -> Result<Vec<ConditionSizes>, ModelError> {
    let tokenizer = tokenizer_in(&dir.root.join("processor"))?;
    let side = output_resolution.map_or(DEFAULT_OUTPUT_RESOLUTION, i64::from) as f64;
    let row = |pictures: &Vec<(u32, u32)>| {
        let mut sizes = ConditionSizes::default();
        for (i, &(w, h)) in pictures.iter().enumerate() {
            let (cw, ch) = calculate_dimensions(side * side, w as f64 / h as f64);
            sizes.encoded.push((cw, ch));
            let slots = (cw as i64 * ch as i64) / (VAE_FACTOR * VAE_FACTOR * 4);
            let words = format!("{}<image{}>", if i == 0 { "" } else { " " }, i + 1);
            sizes.text_tokens += slots as u64 + marker_tokens(tokenizer.as_ref(), &words)?;
        }
        Ok(sizes)
    };
    rows.iter().map(row).collect()
}

/// Prompt states as `encode_prompt` returns them.
pub struct PromptStates {
    /// (B, L, hidden), right-padded with zeros.
    pub embeds: Tensor,
    /// (B, L) i64, ones on tokens; `None` when no row is padded.
    pub mask: Option<Tensor>,
    /// (B, L) i64, ones on the condition images' tokens (`image_pad_mask`).
    pub image_slots: Tensor,
}

/// Qwen3-VL (language model and vision tower) with the processor's tokenizer and image processor.
pub struct QwenImage21PromptEncoder {
    pub encoder: Qwen3VlEncoder,
    pub tokenizer: TextTokenizer,
    pub processor: Qwen2VlImageProcessor,
    /// Leading tokens dropped from the states: the system turn's (`_drop_idx`).
    pub drop: usize,
}

impl QwenImage21PromptEncoder {
    /// Loads `text_encoder/` (a `Qwen3VLForConditionalGeneration`) and the tokenizer and image
    /// processor of `processor/`; an encoder narrower than the transformer's `context_in_dim`, or
    /// a processor whose patches are not the vision tower's, is refused naming its file.
    pub fn load(
        dir: &PipelineDir,
        options: &PipelineOptions,
        context_in_dim: i64,
    ) -> Result<Self, ModelError> {
        let encoder_dir = dir.component("text_encoder", &["Qwen3VLForConditionalGeneration"])?;
        let kind = options.dtypes.text_encoders;
        let encoder = Qwen3VlEncoder::load(&encoder_dir, options.encoder_device(), kind)?;
        if encoder.text.hidden_size() != context_in_dim {
            return Err(ModelError::Input(format!(
                "{}: hidden_size {} differs from the transformer's context_in_dim {context_in_dim}",
                encoder_dir.join("config.json").display(),
                encoder.text.hidden_size()
            )));
        }
        let processor_dir = dir.tokenizer("processor")?;
        let tokenizer = TextTokenizer::load(&processor_dir)?;
        let processor = Qwen2VlImageProcessor::load(&processor_dir)?;
        let v = &encoder.vision.config;
        let (p, m, t) = (processor.patch_size, processor.merge_size, processor.temporal_patch_size);
        if (p, m, t) != (v.patch_size, v.spatial_merge_size, v.temporal_patch_size) {
            return Err(ModelError::Input(format!(
                "{}: image processor patch_size {p}, merge_size {m}, temporal_patch_size {t}; the \
                 vision tower has {}, {}, {}",
                processor_dir.join("processor_config.json").display(),
                v.patch_size,
                v.spatial_merge_size,
                v.temporal_patch_size
            )));
        }
        let drop = tokenizer.ids(SYSTEM_TURN)?.len();
        Ok(Self { encoder, tokenizer, processor, drop })
    }

    /// The token ids of `prompt` in the template after `pictures` (the `ti2i` template's
    /// placeholders, `<|image_pad|>` expanded to `tokens[i]` tokens for picture i; none: the t2i
    /// template). An empty prompt reads `" "`, as the pipeline.
    pub fn ids(&self, prompt: &str, tokens: &[usize]) -> Result<Vec<u32>, ModelError> {
        let prompt = if prompt.is_empty() { " " } else { prompt };
        let mut text = format!("{SYSTEM_TURN}{}", USER_TURN.0);
        for (i, &n) in tokens.iter().enumerate() {
            let space = if i == 0 { "" } else { " " };
            let pads = IMAGE_PAD.repeat(n);
            text.push_str(&format!("{space}<image{}><|vision_start|>{pads}<|vision_end|>", i + 1));
        }
        self.tokenizer.ids(&format!("{text}{prompt}{}", USER_TURN.1))
    }

    /// `encode_prompt` of `prompts`, each with the same condition `pictures` (none allowed), each
    /// already at its condition size: every prompt is encoded alone, which equals the pipeline's
    /// left-padded batch (positions follow the mask).
    pub fn encode(
        &self,
        prompts: &[&str],
        pictures: &[RgbImage],
    ) -> Result<PromptStates, ModelError> {
        if prompts.is_empty() || prompts.iter().any(|p| p.contains(IMAGE_PAD)) {
            return Err(ModelError::Input(format!(
                "Qwen-Image 2.1 prompt encoding needs at least one prompt, none containing \
                 {IMAGE_PAD}; got {prompts:?}"
            )));
        }
        let device = self.encoder.text.store.device();
        let mut pixels = vec![];
        let mut grids = vec![];
        for picture in pictures {
            let (h, w) = (picture.height() as usize, picture.width() as usize);
            let (values, grid) = self.processor.preprocess(h, w, picture.as_raw(), device)?;
            pixels.push(values);
            grids.push(grid);
        }
        let merge = self.processor.merge_size;
        let tokens: Vec<usize> =
            grids.iter().map(|(t, h, w)| (t * h * w / (merge * merge)) as usize).collect();
        let features = match pictures.is_empty() {
            true => None,
            false => Some(self.encoder.vision.forward(&Tensor::cat(&pixels, 0), &grids)?),
        };
        let image_token = self.encoder.image_token_id;
        let drop = self.drop as i64;
        let (mut rows, mut slots) = (vec![], vec![]);
        for prompt in prompts {
            let ids: Vec<i64> = self.ids(prompt, &tokens)?.into_iter().map(i64::from).collect();
            let n = ids.len() as i64;
            let ids = Tensor::from_slice(&ids).to_device(device).unsqueeze(0);
            let states = match &features {
                None => self.encoder.text.last_layer(&ids, &ids.ones_like())?,
                Some(f) => {
                    self.encoder.last_layer_with_pictures(&ids, &ids.ones_like(), f, &grids)?
                }
            };
            rows.push(states.squeeze_dim(0).narrow(0, drop, n - drop));
            slots.push(ids.squeeze_dim(0).narrow(0, drop, n - drop).eq(image_token));
        }
        let longest = rows.iter().map(|r| r.size()[0]).max().expect("one row");
        let pad = |t: &Tensor| t.to_kind(Kind::Int64).constant_pad_nd([0, longest - t.size()[0]]);
        let mask: Vec<Tensor> = rows.iter().map(|r| pad(&r.ones_like().select(1, 0))).collect();
        let embeds: Vec<Tensor> =
            rows.iter().map(|r| r.constant_pad_nd([0, 0, 0, longest - r.size()[0]])).collect();
        let padded = rows.iter().any(|r| r.size()[0] < longest);
        Ok(PromptStates {
            embeds: Tensor::stack(&embeds, 0),
            mask: padded.then(|| Tensor::stack(&mask, 0)),
            image_slots: Tensor::stack(&slots.iter().map(pad).collect::<Vec<_>>(), 0),
        })
    }
}

/// Every component of a Qwen-Image 2.1 pipeline.
pub struct QwenImage21Pipeline {
    pub dir: PipelineDir,
    pub transformer: QwenImage21Transformer,
    pub vae: AutoencoderKlQwenImage21,
    /// `None` with random weights ([`crate::StandInText`] encodes; no condition pictures).
    pub text: Option<QwenImage21PromptEncoder>,
    pub scheduler: SchedulerConfig,
    /// The author's sampling sigmas of `model_index.json` (without the terminal 0), used when a
    /// run samples their count of steps.
    pub sample_sigmas: Option<Vec<f64>>,
    /// The side whose square condition pictures are sized to (`output_resolution`).
    pub output_resolution: i64,
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
        let width = transformer.config.context_in_dim;
        let text = crate::random::text_encoders(options, || {
            QwenImage21PromptEncoder::load(&dir, options, width)
        })?;
        let output_resolution = match options.output_resolution {
            Some(r) if r < 32 => {
                return Err(ModelError::Input(format!(
                    "output_resolution {r} (model.output_resolution / --output-resolution): \
                     condition pictures are sized to its square, which needs at least 32"
                )))
            }
            r => r.unwrap_or(DEFAULT_OUTPUT_RESOLUTION),
        };
        Ok(Self {
            vae,
            text,
            scheduler: SchedulerConfig::from_file(&scheduler_dir.join("scheduler_config.json"))?,
            sample_sigmas,
            output_resolution,
            transformer,
            dir,
        })
    }
}

impl QwenImage21Pipeline {
    /// The prompt encoder; an error with random weights, which build none.
    fn encoder(&self) -> Result<&QwenImage21PromptEncoder, ModelError> {
        crate::random::built(&self.text, &self.dir)
    }

    /// Conditioning of prompt states and their mask, in the transformer's dtype and device.
    fn conditioning(&self, embeds: Tensor, mask: Option<Tensor>) -> TextConditioning {
        let (kind, device) = (self.transformer.img_in.weight.kind(), self.device());
        let mut text = TextConditioning::new(embeds.to_kind(kind).to_device(device), None);
        text.mask = mask.map(|m| m.to_device(device));
        text
    }
}

impl FlowPipeline for QwenImage21Pipeline {
    pipeline_parts!();

    fn device(&self) -> Device {
        self.transformer.img_in.weight.device()
    }

    /// The prompts' states with their mask (`None` when no row is padded).
    fn encode_prompts(&self, prompts: &[&str]) -> Result<TextConditioning, ModelError> {
        let states = self.encoder()?.encode(prompts, &[])?;
        Ok(self.conditioning(states.embeds, states.mask))
    }

    /// The prompts with every row sharing the condition `pictures` (none: the text alone, opaque or
    /// not), as `__call__(image=…)` encodes them: each resized once (Pillow's Lanczos through
    /// premultiplied alpha) to `output_resolution`² pixels at its own aspect ratio; the encoder
    /// reads it composited over white, the VAE all its channels (RGB alone for a 3-channel VAE). The conditioning holds the states with the pictures in their vision
    /// slots, and the extras [`CONDITION_LATENTS`] (their normalised VAE latents, one token per
    /// cell, in order), [`CONDITION_SHAPES`] (their (1, h, w) token grids) and [`IMAGE_SLOTS`]
    /// (the slots, up to the last: the same for every prompt, whatever its length).
    fn encode_prompts_with_pictures(
        &self,
        prompts: &[&str],
        pictures: &[RgbaImage],
        _latent_shape: &[i64],
    ) -> Result<TextConditioning, ModelError> {
        if pictures.is_empty() {
            return self.encode_prompts(prompts);
        }
        let encoder = self.encoder()?;
        let area = (self.output_resolution * self.output_resolution) as f64;
        let mut sized = vec![];
        for picture in pictures {
            let (w, h) = (picture.width(), picture.height());
            let (cw, ch) = calculate_dimensions(area, w as f64 / h as f64);
            if cw == 0 || ch == 0 {
                return Err(ModelError::Input(format!(
                    "a {w}×{h} condition picture is sized to {cw}×{ch} at output_resolution {}: \
                     its aspect ratio is too extreme for QwenImage21Pipeline",
                    self.output_resolution
                )));
            }
            sized.push(resize_rgba(picture, cw, ch, Filter::Lanczos));
        }
        let seen: Vec<RgbImage> = sized.iter().map(over_white).collect();
        let states = encoder.encode(prompts, &seen)?;
        let slots = states.image_slots.get(0);
        let token_count: i64 = sized.iter().map(|p| (p.width() * p.height()) as i64).sum::<i64>()
            / (VAE_FACTOR * VAE_FACTOR * 4);
        if slots.sum(Kind::Int64).int64_value(&[]) != token_count {
            return Err(ModelError::Input(format!(
                "{}: the image processor resized the condition pictures ({:?}) to another grid \
                 than the VAE's (pixel bounds {}‥{}): their encoder slots and latent tokens differ",
                self.dir.root.join("processor").display(),
                sized.iter().map(|p| (p.width(), p.height())).collect::<Vec<_>>(),
                encoder.processor.min_pixels,
                encoder.processor.max_pixels
            )));
        }
        let last = Vec::<i64>::try_from(&slots)?.iter().rposition(|&s| s != 0).expect("slots");
        let mut text = self.conditioning(states.embeds, states.mask);
        let device = self.device();
        let (b, n) = (prompts.len() as i64, pictures.len() as i64);
        let channels = self.vae.config.in_channels;
        let (mut tokens, mut grids) = (vec![], vec![]);
        for picture in &sized {
            let (w, h) = (picture.width() as i64, picture.height() as i64);
            let pixels =
                Tensor::from_slice(picture.as_raw()).view([1, h, w, 4]).narrow(3, 0, channels);
            let latents = run_on(self.vae.store.device(), &pixels, |p| {
                let x = p.permute([0, 3, 1, 2]).to_kind(Kind::Float) / 127.5 - 1.0;
                self.vae.encode(&x).to_kind(Kind::Float)
            });
            tokens.push(latents.flatten(2, 3).transpose(1, 2));
            grids.extend([1, h / VAE_FACTOR, w / VAE_FACTOR]);
        }
        let latents = Tensor::cat(&tokens, 1).to_device(device).expand([b, -1, -1], false);
        let grids = Tensor::from_slice(&grids).view([1, n, 3]).expand([b, n, 3], false);
        let slots = slots.narrow(0, 0, last as i64 + 1).unsqueeze(0).expand([b, -1], false);
        text.extras.insert(CONDITION_LATENTS.into(), latents.contiguous());
        text.extras.insert(CONDITION_SHAPES.into(), grids.contiguous().to_device(device));
        text.extras.insert(IMAGE_SLOTS.into(), slots.contiguous().to_device(device));
        Ok(text)
    }

    fn takes_alpha(&self) -> bool {
        true
    }

    fn takes_output_resolution(&self) -> bool {
        true
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
