//! The Wan pipeline: a diffusers `WanPipeline` directory (Wan2.1 T2V, Wan2.2-TI2V-5B from text or
//! from a first-frame picture, Wan2.2-T2V-A14B with its two experts) loaded as components, with its
//! prompt encoding, 5-D latent layout, frame count and schedule.

use std::path::Path;

use flowtune_sampling::{GridRequest, Pipeline, SchedulerConfig};
use image::{RgbImage, RgbaImage};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::experts::{check_same_layout, SECOND_EXPERT};
use super::{AutoencoderKlWan, WanExperts, WanTextEncoder, WanTransformer};
use crate::denoiser::TrainableDenoiser;
use crate::family::{FlowPipeline, PipelineOptions};
use crate::pipeline::PipelineDir;
use crate::resize::{resize, Filter};
use crate::vae::AutoencoderKl;
use crate::{ModelError, TextConditioning};

/// Pixel frames of a sample when the options name none: WanPipeline's default `num_frames`.
pub const DEFAULT_NUM_FRAMES: usize = 81;

/// The denoiser of a Wan pipeline: one transformer, or Wan2.2-A14B's two experts.
pub enum WanDenoiser {
    One(Box<WanTransformer>),
    Two(Box<WanExperts>),
}

impl WanDenoiser {
    /// The only transformer, or the high-noise expert.
    pub fn first(&self) -> &WanTransformer {
        match self {
            Self::One(t) => t,
            Self::Two(e) => &e.high,
        }
    }
}

/// `boundary_ratio` of `model_index.json` (the two-expert pipelines').
#[derive(serde::Deserialize)]
struct IndexExtras {
    #[serde(default)]
    boundary_ratio: Option<f64>,
    #[serde(default)]
    expand_timesteps: bool,
}

/// Every component of a Wan text-to-video pipeline.
pub struct WanPipeline {
    pub dir: PipelineDir,
    pub transformer: WanDenoiser,
    pub vae: AutoencoderKlWan,
    /// UMT5 and its tokenizer; `None` with random weights ([`crate::StandInText`] encodes).
    pub text: Option<WanTextEncoder>,
    pub scheduler: SchedulerConfig,
    /// Pixel frames of every sample (4k + 1 for the released VAEs).
    pub num_frames: usize,
    /// `expand_timesteps` of `model_index.json` (Wan2.2-TI2V-5B): per-token timesteps, and
    /// image-to-video by holding the first latent frame at the condition picture's latents.
    pub expand_timesteps: bool,
}

impl WanPipeline {
    /// Loads the `WanPipeline` directory at `path`.
    pub fn load(path: &Path, options: &PipelineOptions) -> Result<Self, ModelError> {
        Self::open(PipelineDir::open(path)?, options)
    }

    /// Loads the components of an opened pipeline directory. With `transformer_2` and
    /// `boundary_ratio` in the index (Wan2.2-A14B), both experts load, each with the LoRA
    /// config of the options.
    pub fn open(dir: PipelineDir, options: &PipelineOptions) -> Result<Self, ModelError> {
        let (device, dtypes) = (options.device, options.dtypes);
        let index = dir.root.join("model_index.json");
        let extras: IndexExtras = crate::read_config(&index)?;
        let scheduler_dir = dir.component("scheduler", &["UniPCMultistepScheduler"])?;
        let scheduler = SchedulerConfig::from_file(&scheduler_dir.join("scheduler_config.json"))?;
        let load_transformer = |name: &str| {
            WanTransformer::load(
                &dir.component(name, &["WanTransformer3DModel"])?,
                device,
                dtypes.transformer,
                options.lora.as_ref(),
            )
        };
        let transformer = match (dir.has(SECOND_EXPERT), extras.boundary_ratio) {
            (false, None) => WanDenoiser::One(Box::new(load_transformer("transformer")?)),
            (true, Some(ratio)) if ratio > 0.0 && ratio < 1.0 => {
                let train_steps = f64::from(scheduler.num_train_timesteps);
                let (high, low) =
                    (load_transformer("transformer")?, load_transformer(SECOND_EXPERT)?);
                let configs =
                    ["transformer", SECOND_EXPERT].map(|c| dir.root.join(c).join("config.json"));
                check_same_layout(&high, &low, [&configs[0], &configs[1]])?;
                WanDenoiser::Two(Box::new(WanExperts { high, low, boundary: ratio * train_steps }))
            }
            (two, ratio) => {
                return Err(ModelError::Format {
                    path: index.display().to_string(),
                    message: match (two, ratio) {
                        (true, None) => "transformer_2 (a second expert, Wan2.2-A14B) needs a \
                                         boundary_ratio"
                            .into(),
                        (false, Some(r)) => format!(
                            "boundary_ratio {r} is for two experts, but there is no transformer_2"
                        ),
                        (_, r) => format!(
                            "boundary_ratio {r:?}: expected a fraction of the train timesteps \
                             strictly between 0 and 1"
                        ),
                    },
                })
            }
        };
        let text = crate::random::text_encoders(options, || {
            let mut text = WanTextEncoder::load(
                &dir.tokenizer("tokenizer")?,
                &dir.component("text_encoder", &["UMT5EncoderModel"])?,
                options.encoder_device(),
                dtypes.text_encoders,
            )?;
            if let Some(n) = options.max_sequence_length {
                text.max_sequence_length = n;
            }
            Ok(text)
        })?;
        let vae = AutoencoderKlWan::load(
            &dir.component("vae", &["AutoencoderKLWan"])?,
            options.vae_device(),
            dtypes.vae,
        )?;
        let num_frames = options.num_frames.unwrap_or(DEFAULT_NUM_FRAMES);
        latent_frames(num_frames, vae.config.temporal_factor())?;
        let expand_timesteps = extras.expand_timesteps;
        Ok(Self { transformer, vae, text, scheduler, num_frames, expand_timesteps, dir })
    }

    /// The first-frame latents (1, z, 1, h, w) of image-to-video samples of `latent_shape`
    /// `[z, F, h, w]`, as WanImageToVideoPipeline makes them with `expand_timesteps`: the picture
    /// resized to the sample's size with Pillow's Lanczos, encoded alone as a one-frame clip, the
    /// posterior mean normalised.
    pub fn first_frame_latents(
        &self,
        picture: &RgbImage,
        latent_shape: &[i64],
    ) -> Result<Tensor, ModelError> {
        let root = self.dir.root.display();
        if !self.expand_timesteps {
            return Err(ModelError::Input(format!(
                "{root}: image-to-video needs a Wan2.2-TI2V pipeline (`expand_timesteps: true` in \
                 model_index.json); Wan2.1 and Wan2.2-A14B image-to-video checkpoints (image \
                 embeddings, 36 input channels) are not supported"
            )));
        }
        let &[_, frames, h, w] = latent_shape else {
            return Err(ModelError::Input(format!(
                "image-to-video samples a clip [C, F, H, W]; the latent shape is {latent_shape:?}"
            )));
        };
        if frames < 2 {
            return Err(ModelError::Input(format!(
                "num_frames {} (model.num_frames / --num-frames): image-to-video needs at least \
                 {} frames, the first being the picture",
                self.num_frames,
                self.vae.config.temporal_factor() + 1
            )));
        }
        let s = self.vae.config.spatial_factor();
        let (height, width) = ((h * s) as u32, (w * s) as u32);
        let sized = resize(picture, width, height, Filter::Lanczos);
        let pixels = Tensor::from_slice(sized.as_raw())
            .view([1, height as i64, width as i64, 3])
            .to_device(self.vae.store.device());
        let video = AutoencoderKl::from_rgb8(&pixels).unsqueeze(2);
        let (mean, _) = self.vae.encode_video(&video.to_kind(self.vae.encoder_kind()))?;
        Ok(mean.to_kind(Kind::Float).to_device(self.device()))
    }

    /// Pixels per latent cell on a side times the transformer's spatial patch: the multiple the
    /// sides must be.
    pub fn side_multiple(&self) -> i64 {
        let [_, ph, pw] = self.transformer.first().config.patch();
        self.vae.config.spatial_factor() * ph.max(pw)
    }
}

/// Latent frames of `frames` pixel frames: `(frames − 1)/factor + 1`; the error names
/// model.num_frames / --num-frames and the allowed counts.
fn latent_frames(frames: usize, factor: i64) -> Result<i64, ModelError> {
    let factor = factor as usize;
    if frames == 0 || !(frames - 1).is_multiple_of(factor) {
        return Err(ModelError::Input(format!(
            "num_frames {frames} (model.num_frames / --num-frames): Wan's VAE takes {factor}k + 1 \
             frames (1, {}, {}, …, {DEFAULT_NUM_FRAMES})",
            factor + 1,
            2 * factor + 1
        )));
    }
    Ok(((frames - 1) / factor + 1) as i64)
}

impl FlowPipeline for WanPipeline {
    fn dir(&self) -> &PipelineDir {
        &self.dir
    }

    fn scheduler(&self) -> &SchedulerConfig {
        &self.scheduler
    }

    fn denoiser(&self) -> &dyn TrainableDenoiser {
        match &self.transformer {
            WanDenoiser::One(t) => t.as_ref(),
            WanDenoiser::Two(e) => e.as_ref(),
        }
    }

    fn denoiser_mut(&mut self) -> &mut dyn TrainableDenoiser {
        match &mut self.transformer {
            WanDenoiser::One(t) => t.as_mut(),
            WanDenoiser::Two(e) => e.as_mut(),
        }
    }

    fn device(&self) -> Device {
        self.transformer.first().patch_embedding.0.device()
    }

    /// UMT5's last hidden state of each cleaned prompt, zero past its tokens up to
    /// `max_sequence_length` (WanPipeline's `prompt_embeds`, read without a mask).
    fn encode_prompts(&self, prompts: &[&str]) -> Result<TextConditioning, ModelError> {
        let text = crate::random::built(&self.text, &self.dir)?;
        let (embeds, _) = text.encode(prompts)?;
        let kind = self.transformer.first().patch_embedding.0.kind();
        Ok(TextConditioning::new(embeds.to_kind(kind).to_device(self.device()), None))
    }

    /// Wan2.2-TI2V image-to-video: one picture, the first frame of every sample, held as the
    /// [`crate::HELD_LATENTS`] of each row.
    fn encode_prompts_with_pictures(
        &self,
        prompts: &[&str],
        pictures: &[RgbaImage],
        latent_shape: &[i64],
    ) -> Result<TextConditioning, ModelError> {
        let class = &self.dir.index.class_name;
        let Some(picture) = crate::pictures::first_frame(pictures, class)? else {
            return self.encode_prompts(prompts);
        };
        let held = self.first_frame_latents(&picture, latent_shape)?;
        Ok(self.encode_prompts(prompts)?.holding(&held))
    }

    /// `[z, (F − 1)/4 + 1, H/s, W/s]` for `num_frames` F; sides must be multiples of s × the
    /// transformer's patch (32 for Wan2.2's 16× VAE, 16 for Wan2.1's 8×).
    fn latent_shape(&self, height: i64, width: i64) -> Result<Vec<i64>, ModelError> {
        let multiple = self.side_multiple();
        for side in [height, width] {
            if side <= 0 || side % multiple != 0 {
                return Err(ModelError::Input(format!(
                    "{side} pixels (model.resolution / --resolution): Wan needs sides that are \
                     positive multiples of {multiple} (VAE factor {} × patch size)",
                    self.vae.config.spatial_factor()
                )));
            }
        }
        let s = self.vae.config.spatial_factor();
        let frames = latent_frames(self.num_frames, self.vae.config.temporal_factor())?;
        Ok(vec![self.vae.config.z_dim, frames, height / s, width / s])
    }

    /// UniPC's flow sigmas with `flow_shift`; the shift is static.
    fn grid_request(&self, steps: usize, _latent_shape: &[i64]) -> GridRequest {
        GridRequest { steps, pipeline: Pipeline::Wan, ..Default::default() }
    }

    /// The clip's frames side by side: (B, H, T·W, 3).
    fn decode_rgb8(&self, latents: &Tensor) -> Result<Tensor, ModelError> {
        let video = self.vae.decode_video(&latents.to_device(self.vae.store.device()))?;
        let (b, c, t, h, w) = video.size5()?;
        let frames =
            AutoencoderKl::to_rgb8(&video.permute([0, 2, 1, 3, 4]).reshape([b * t, c, h, w]));
        let side_by_side = frames.reshape([b, t, h, w, 3]).permute([0, 2, 1, 3, 4]);
        Ok(side_by_side.reshape([b, h, t * w, 3]).to_device(latents.device()))
    }

    /// The inverse of [`Self::decode_rgb8`] at the pipeline's `num_frames`: each row is cut into
    /// that many frames side by side (one frame: a picture) and encoded as a clip.
    fn encode_rgb8(&self, images: &Tensor) -> Result<Tensor, ModelError> {
        let (b, h, tw, _) = images.size4()?;
        let t = self.num_frames as i64;
        if tw % t != 0 {
            return Err(ModelError::Input(format!(
                "pictures {tw} pixels wide do not hold {t} frames side by side (num_frames)"
            )));
        }
        let frames = images.reshape([b, h, t, tw / t, 3]).permute([0, 2, 1, 3, 4]);
        let pixels = AutoencoderKl::from_rgb8(&frames.reshape([b * t, h, tw / t, 3]));
        let video = pixels.reshape([b, t, 3, h, tw / t]).permute([0, 2, 1, 3, 4]);
        let video = video.to_kind(self.vae.encoder_kind()).to_device(self.vae.store.device());
        let (mean, _) = self.vae.encode_video(&video)?;
        Ok(mean.to_kind(Kind::Float).to_device(images.device()))
    }

    fn takes_num_frames(&self) -> bool {
        true
    }

    /// `factor·(F − 1) + 1` pixel frames of F latent frames.
    fn decoded_frames(&self, latent_shape: &[i64]) -> usize {
        match latent_shape {
            [_, f, _, _] => (self.vae.config.temporal_factor() * (f - 1) + 1) as usize,
            _ => 1,
        }
    }

    fn trained_stores(&self) -> Vec<(&'static str, &'static str, &VarStore)> {
        let file = "diffusion_pytorch_model.safetensors";
        match &self.transformer {
            WanDenoiser::One(t) => vec![("transformer", file, &t.weights.base)],
            WanDenoiser::Two(e) => vec![
                ("transformer", file, &e.high.weights.base),
                (SECOND_EXPERT, file, &e.low.weights.base),
            ],
        }
    }
}
