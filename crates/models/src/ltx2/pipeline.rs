//! The LTX-2 pipeline: a diffusers `LTX2Pipeline` directory loaded as components, with its prompt
//! encoding (Gemma-3 hidden states of every layer through the connectors), its joint latent of
//! video and audio tokens ([`super::latents`]), its sigma grid and its decoding to frames and
//! sound.

use std::path::Path;
use std::sync::Mutex;

use flowtune_sampling::{GridRequest, Pipeline, SchedulerConfig};
use image::{RgbImage, RgbaImage};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::audio_vae::AutoencoderKlLtx2Audio;
use super::connectors::Ltx2TextConnectors;
use super::latents::{split, Compression, Geometry, Patches};
use super::transformer::{Ltx2Transformer, AUDIO_EMBEDS, FPS, VIDEO_SHAPE};
use super::video_vae::AutoencoderKlLtx2Video;
use super::vocoder::Ltx2Vocoder;
use crate::audio::Waveform;
use crate::denoiser::TrainableDenoiser;
use crate::family::{FlowPipeline, PipelineOptions};
use crate::pipeline::PipelineDir;
use crate::resize::{resize, Filter};
use crate::text_encoders::gemma3::prompts::{Gemma3PromptEncoder, MAX_SEQUENCE_LENGTH};
use crate::vae::AutoencoderKl;
use crate::{ModelError, TextConditioning};

/// Pixel frames of a sample when the options name none: LTX2Pipeline's default `num_frames`.
pub const DEFAULT_NUM_FRAMES: usize = 121;
/// The frame rate samples play at and their positions are conditioned on: LTX2Pipeline's default.
pub const DEFAULT_FRAME_RATE: f64 = 24.0;

/// Gemma-3 with its tokenizer, and the connectors that turn its layers into the transformer's
/// video and audio text states.
pub struct Ltx2Text {
    pub encoder: Gemma3PromptEncoder,
    pub connectors: Ltx2TextConnectors,
    pub max_sequence_length: usize,
}

/// Every component of an LTX-2 text-to-video-and-audio pipeline.
pub struct Ltx2Pipeline {
    pub dir: PipelineDir,
    pub transformer: Ltx2Transformer,
    pub vae: AutoencoderKlLtx2Video,
    pub audio_vae: AutoencoderKlLtx2Audio,
    pub vocoder: Ltx2Vocoder,
    /// `None` with random weights ([`crate::StandInText`] encodes).
    pub text: Option<Ltx2Text>,
    pub scheduler: SchedulerConfig,
    /// Pixel frames of every sample (8k + 1).
    pub num_frames: usize,
    pub frame_rate: f64,
    /// The sample geometry of the last [`FlowPipeline::latent_shape`]: the video's rows and
    /// columns are not in the joint latent's shape, so prompts carry them to the denoiser.
    geometry: Mutex<Option<Geometry>>,
}

impl Ltx2Pipeline {
    /// Loads the `LTX2Pipeline` directory at `path`.
    pub fn load(path: &Path, options: &PipelineOptions) -> Result<Self, ModelError> {
        Self::open(PipelineDir::open(path)?, options)
    }

    /// Loads the components of an opened pipeline directory.
    pub fn open(dir: PipelineDir, options: &PipelineOptions) -> Result<Self, ModelError> {
        let (device, dtypes) = (options.device, options.dtypes);
        let scheduler_dir = dir.component("scheduler", &["FlowMatchEulerDiscreteScheduler"])?;
        let scheduler = SchedulerConfig::from_file(&scheduler_dir.join("scheduler_config.json"))?;
        let transformer = Ltx2Transformer::load(
            &dir.component("transformer", &["LTX2VideoTransformer3DModel"])?,
            device,
            dtypes.transformer,
            options.lora.as_ref(),
        )?;
        let text = crate::random::text_encoders(options, || {
            let encoder = Gemma3PromptEncoder::load(
                &dir.component("text_encoder", &["Gemma3ForConditionalGeneration"])?,
                &dir.tokenizer("tokenizer")?,
                options.encoder_device(),
                dtypes.text_encoders,
            )?;
            let connectors = Ltx2TextConnectors::load(
                &dir.component("connectors", &["LTX2TextConnectors"])?,
                options.encoder_device(),
                dtypes.text_encoders,
            )?;
            let max_sequence_length = options.max_sequence_length.unwrap_or(MAX_SEQUENCE_LENGTH);
            Ok(Ltx2Text { encoder, connectors, max_sequence_length })
        })?;
        let vae_device = options.vae_device();
        let vae = AutoencoderKlLtx2Video::load(
            &dir.component("vae", &["AutoencoderKLLTX2Video"])?,
            vae_device,
            dtypes.vae,
        )?;
        let audio_vae = AutoencoderKlLtx2Audio::load(
            &dir.component("audio_vae", &["AutoencoderKLLTX2Audio"])?,
            vae_device,
            dtypes.vae,
        )?;
        let vocoder = Ltx2Vocoder::load(
            &dir.component("vocoder", &["LTX2Vocoder", "LTX2VocoderWithBWE"])?,
            vae_device,
            dtypes.vae,
        )?;
        let pipe = Self {
            transformer,
            vae,
            audio_vae,
            vocoder,
            text,
            scheduler,
            num_frames: options.num_frames.unwrap_or(DEFAULT_NUM_FRAMES),
            frame_rate: options.frame_rate.unwrap_or(DEFAULT_FRAME_RATE),
            geometry: Mutex::new(None),
            dir,
        };
        pipe.check_widths()?;
        let side = pipe.compression().spatial;
        pipe.compression().geometry(pipe.num_frames as i64, side, side, pipe.frame_rate)?;
        Ok(pipe)
    }

    /// The video and audio tokens must be one width (the joint latent), the width the VAEs give.
    fn check_widths(&self) -> Result<(), ModelError> {
        let c = &self.transformer.config;
        let p = self.patches();
        let video = self.vae.config.latent_channels * p.temporal * p.spatial * p.spatial;
        let audio = self.audio_vae.config.latent_channels * self.audio_vae.config.latent_mel_bins();
        if (video, audio) != (c.in_channels, c.audio_in_channels) {
            return Err(ModelError::Format {
                path: self.dir.root.join("transformer/config.json").display().to_string(),
                message: format!(
                    "in_channels {} / audio_in_channels {} do not match the VAEs' packed latents \
                     ({video} video: latent_channels × patches; {audio} audio: latent_channels × \
                     mel_bins/4)",
                    c.in_channels, c.audio_in_channels
                ),
            });
        }
        Ok(())
    }

    /// The VAEs' compression and the audio's rate.
    pub fn compression(&self) -> Compression {
        let audio = &self.audio_vae.config;
        Compression {
            spatial: self.vae.spatial_compression_ratio(),
            temporal: self.vae.temporal_compression_ratio(),
            sample_rate: audio.sample_rate,
            hop_length: audio.mel_hop_length,
            audio_temporal: self.audio_vae.temporal_compression_ratio(),
        }
    }

    /// The transformer's patch sizes.
    pub fn patches(&self) -> Patches {
        let c = &self.transformer.config;
        Patches { temporal: c.patch_size_t, spatial: c.patch_size }
    }

    /// The geometry of the samples [`FlowPipeline::latent_shape`] last sized.
    pub fn geometry(&self) -> Result<Geometry, ModelError> {
        self.geometry.lock().expect("geometry lock").ok_or_else(|| {
            ModelError::Input(
                "LTX-2 needs the sample size (latent_shape) before prompts or latents".into(),
            )
        })
    }

    /// The first frame's video tokens (1, Sh, C) of image-to-video samples of the current
    /// geometry, as LTX2ImageToVideoPipeline makes them with `image_crf=0`: the picture resized
    /// to the sample's size with Pillow's bilinear filter (the pipeline's video processor),
    /// encoded alone as a one-frame clip, the posterior mean normalised (`_normalize_latents` at
    /// its default scaling factor 1) and packed.
    pub fn first_frame_latents(&self, picture: &RgbImage) -> Result<Tensor, ModelError> {
        let g = self.geometry()?;
        let p = self.patches();
        if g.frames < 2 || p.temporal != 1 {
            return Err(ModelError::Input(format!(
                "{}: image-to-video needs at least {} frames (model.num_frames / --num-frames; \
                 got {}) and a transformer without temporal patches (patch_size_t {})",
                self.dir.root.display(),
                self.compression().temporal + 1,
                self.num_frames,
                p.temporal
            )));
        }
        let s = self.compression().spatial;
        let (height, width) = (g.height * s, g.width * s);
        let sized = resize(picture, width as u32, height as u32, Filter::Bilinear);
        let vae_device = self.vae.store.device();
        let pixels =
            Tensor::from_slice(sized.as_raw()).view([1, height, width, 3]).to_device(vae_device);
        let clip = AutoencoderKl::from_rgb8(&pixels).unsqueeze(2);
        let (mean, _) = self.vae.encode(&clip.to_kind(self.vae.kind()))?;
        // diffusers normalises the condition at scaling factor 1, whatever the VAE's config says.
        let normalised =
            self.vae.normalize_latents(&mean.to_kind(Kind::Float))? / self.vae.scaling_factor();
        Ok(p.pack_video(&normalised).to_device(self.device()))
    }

    /// The video and audio parts of joint latents of the current geometry.
    fn parts(&self, latents: &Tensor) -> Result<(Tensor, Tensor, Geometry), ModelError> {
        let g = self.geometry()?;
        let (video, audio) = split(latents, self.patches().video_tokens(&g))?;
        Ok((video, audio, g))
    }
}

impl FlowPipeline for Ltx2Pipeline {
    fn dir(&self) -> &PipelineDir {
        &self.dir
    }

    fn scheduler(&self) -> &SchedulerConfig {
        &self.scheduler
    }

    fn denoiser(&self) -> &dyn TrainableDenoiser {
        &self.transformer
    }

    fn denoiser_mut(&mut self) -> &mut dyn TrainableDenoiser {
        &mut self.transformer
    }

    fn device(&self) -> Device {
        self.transformer.proj_in.weight.device()
    }

    /// Gemma-3's hidden states of each stripped, left-padded prompt through the connectors:
    /// the video text states as the embeds, the audio ones as an extra, the connectors' mask.
    fn encode_prompts(&self, prompts: &[&str]) -> Result<TextConditioning, ModelError> {
        let text = crate::random::built(&self.text, &self.dir)?;
        let out =
            text.connectors.encode_prompts(&text.encoder, prompts, text.max_sequence_length)?;
        let (kind, device) = (self.transformer.proj_in.weight.kind(), self.device());
        let mut cond = TextConditioning::new(out.video.to_kind(kind).to_device(device), None);
        cond.mask = Some(out.mask.to_device(device));
        cond.extras.insert(AUDIO_EMBEDS.into(), out.audio.to_kind(kind).to_device(device));
        self.sample_conditioning(&mut cond)?;
        Ok(cond)
    }

    /// LTX-2 image-to-video with sound: one picture, the first frame of every sample, held as
    /// the [`crate::HELD_LATENTS`] (the first frame's leading tokens) of each row.
    fn encode_prompts_with_pictures(
        &self,
        prompts: &[&str],
        pictures: &[RgbaImage],
        _latent_shape: &[i64],
    ) -> Result<TextConditioning, ModelError> {
        let class = &self.dir.index.class_name;
        let Some(picture) = crate::pictures::first_frame(pictures, class)? else {
            return self.encode_prompts(prompts);
        };
        let held = self.first_frame_latents(&picture)?;
        Ok(self.encode_prompts(prompts)?.holding(&held))
    }

    /// Each row's latent video size and frame rate, from the current geometry.
    fn sample_conditioning(&self, text: &mut TextConditioning) -> Result<(), ModelError> {
        let g = self.geometry()?;
        let (rows, device) = (text.embeds.size()[0], self.device());
        let shape = Tensor::from_slice(&[g.frames, g.height, g.width]).to_device(device);
        text.extras.insert(VIDEO_SHAPE.into(), shape.repeat([rows, 1]));
        text.extras.insert(FPS.into(), Tensor::full([rows], g.fps, (Kind::Float, device)));
        Ok(())
    }

    /// `[S_v + S_a, C]`: the video's packed patch tokens, then one token per audio latent frame,
    /// for `num_frames` frames of `height` × `width` at the frame rate.
    fn latent_shape(&self, height: i64, width: i64) -> Result<Vec<i64>, ModelError> {
        let g =
            self.compression().geometry(self.num_frames as i64, height, width, self.frame_rate)?;
        let p = self.patches();
        if g.frames % p.temporal != 0 || g.height % p.spatial != 0 || g.width % p.spatial != 0 {
            return Err(ModelError::Input(format!(
                "{height} × {width} pixels, {} frames: the latent video {}×{}×{} is not whole \
                 transformer patches of {}×{}×{}",
                self.num_frames, g.frames, g.height, g.width, p.temporal, p.spatial, p.spatial
            )));
        }
        *self.geometry.lock().expect("geometry lock") = Some(g);
        let tokens = p.video_tokens(&g) + g.audio_frames;
        Ok(vec![tokens, self.transformer.config.in_channels])
    }

    /// LTX2Pipeline's grid: `linspace(1, 1/N, N)` shifted by μ of the video token count.
    fn grid_request(&self, steps: usize, _latent_shape: &[i64]) -> GridRequest {
        let video_tokens = self.geometry().ok().map(|g| self.patches().video_tokens(&g) as u64);
        GridRequest {
            steps,
            pipeline: Pipeline::Flux,
            image_seq_len: video_tokens,
            ..Default::default()
        }
    }

    /// The clip's frames side by side: (B, H, T·W, 3), decoded as the pipeline does with its
    /// default `decode_timestep` 0 (no noise mixed in).
    fn decode_rgb8(&self, latents: &Tensor) -> Result<Tensor, ModelError> {
        let (video, _, g) = self.parts(latents)?;
        let vae_device = self.vae.store.device();
        let packed = self.patches().unpack_video(&video.to_device(vae_device), &g);
        let raw = self.vae.denormalize_latents(&packed.to_kind(Kind::Float))?;
        let timestep = self
            .vae
            .config
            .timestep_conditioning
            .then(|| Tensor::zeros([raw.size()[0]], (Kind::Float, vae_device)));
        let clip = self.vae.decode(&raw.to_kind(self.vae.kind()), timestep.as_ref())?;
        let (b, c, t, h, w) = clip.size5()?;
        let frames =
            AutoencoderKl::to_rgb8(&clip.permute([0, 2, 1, 3, 4]).reshape([b * t, c, h, w]));
        let side_by_side = frames.reshape([b, t, h, w, 3]).permute([0, 2, 1, 3, 4]);
        Ok(side_by_side.reshape([b, h, t * w, 3]).to_device(latents.device()))
    }

    /// The vocoder's waveform of the audio tokens' decoded spectrogram.
    fn decode_audio(&self, latents: &Tensor) -> Result<Option<Vec<Waveform>>, ModelError> {
        let (_, audio, _) = self.parts(latents)?;
        let tokens = audio.to_device(self.audio_vae.store.device()).to_kind(Kind::Float);
        let mel = self.audio_vae.decode_tokens(&tokens)?;
        let wave = self.vocoder.forward(&mel)?;
        Ok(Some(Waveform::from_batch(&wave, self.vocoder.output_sampling_rate() as u32)?))
    }

    /// Pictures alone hold no sound: LTX-2's latents cannot be made from them.
    fn encode_rgb8(&self, _images: &Tensor) -> Result<Tensor, ModelError> {
        Err(ModelError::Input(format!(
            "{}: LTX-2 samples are video with sound; latents cannot be encoded from pictures \
             alone (offline preference pairs and pre-training on pictures are not supported)",
            self.dir.root.display()
        )))
    }

    fn takes_num_frames(&self) -> bool {
        true
    }

    fn takes_frame_rate(&self) -> bool {
        true
    }

    fn decoded_frames(&self, _latent_shape: &[i64]) -> usize {
        self.num_frames
    }

    fn trained_stores(&self) -> Vec<(&'static str, &'static str, &VarStore)> {
        vec![("transformer", "diffusion_pytorch_model.safetensors", &self.transformer.weights.base)]
    }
}
