//! The pipeline seam: what the rollout engine, the trainer and the commands need of a model
//! family's pipeline (prompt encoding, latent shapes, the sigma grid, decoding and encoding
//! images, the denoiser), and the settings every family loads with.

use std::collections::BTreeMap;
use std::path::PathBuf;

use flowtune_sampling::{GridRequest, SchedulerConfig};
use image::RgbaImage;
use serde::{Deserialize, Serialize};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::audio::Waveform;
use crate::denoiser::TrainableDenoiser;
use crate::lora::LoraConfig;
use crate::pipeline::PipelineDir;
use crate::{ModelError, TextConditioning};

/// A floating-point storage type, as recipes write it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    #[default]
    F32,
    Bf16,
    F16,
}

impl Dtype {
    pub fn kind(self) -> Kind {
        match self {
            Self::F32 => Kind::Float,
            Self::Bf16 => Kind::BFloat16,
            Self::F16 => Kind::Half,
        }
    }
}

/// Per-component dtypes (scheduler and SDE math stay f32 regardless).
#[derive(Debug, Clone, Copy)]
pub struct Dtypes {
    /// The denoiser.
    pub transformer: Kind,
    pub text_encoders: Kind,
    pub vae: Kind,
}

impl Dtypes {
    /// One dtype for everything.
    pub fn all(kind: Kind) -> Self {
        Self { transformer: kind, text_encoders: kind, vae: kind }
    }
}

/// Which frozen components live and run on the CPU instead of the training device
/// (`model.offload`): their weights never take device memory; their inputs go to the CPU and
/// their outputs come back, so results are those of resident components.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Offload {
    /// Everything on the training device.
    #[default]
    None,
    /// Text encoders (and Qwen2.5-VL's vision tower) on the CPU.
    Encoders,
    /// Text encoders and the VAE on the CPU.
    EncodersAndVae,
}

/// `input` through `f` on `device` (an offloaded component's), the result back on `input`'s
/// device; nothing moves when the devices are the same.
pub(crate) fn run_on(device: Device, input: &Tensor, f: impl FnOnce(&Tensor) -> Tensor) -> Tensor {
    f(&input.to_device(device)).to_device(input.device())
}

/// How to load a pipeline: where, in which dtypes, with which adapters.
#[derive(Debug, Clone)]
pub struct PipelineOptions {
    pub device: Device,
    pub dtypes: Dtypes,
    /// LoRA adapters on the denoiser; `None` for full fine-tuning or plain sampling.
    pub lora: Option<LoraConfig>,
    /// Text tokens of the long text encoder (T5 for SD3), where the family has such a limit.
    pub max_sequence_length: Option<usize>,
    /// The distilled guidance value of a guidance-embedding model (FLUX.1 [dev]); `None` is the
    /// family's default.
    pub embedded_guidance: Option<f64>,
    /// Pixel frames of a video family's samples; `None` is the family's default. Image families
    /// refuse it.
    pub num_frames: Option<usize>,
    /// Frames per second of a family with sound (LTX-2): how long a sample lasts, so how much
    /// audio it holds, and what its positions are conditioned on; `None` is the family's default.
    pub frame_rate: Option<f64>,
    /// The side whose square condition pictures are sized to (Qwen-Image 2.1's
    /// `output_resolution`); `None` is the family's default. Other families refuse it.
    pub output_resolution: Option<i64>,
    /// Frozen components on the CPU.
    pub offload: Offload,
    /// Seeded random weights instead of the checkpoint files, and stand-in prompt embeddings
    /// instead of the text encoders, which are then not built ([`crate::random`]).
    pub random: Option<crate::RandomWeights>,
}

impl PipelineOptions {
    /// f32 on `device`, no adapters, the family's own sequence length and guidance.
    pub fn new(device: Device) -> Self {
        Self {
            device,
            dtypes: Dtypes::all(Kind::Float),
            lora: None,
            max_sequence_length: None,
            embedded_guidance: None,
            num_frames: None,
            frame_rate: None,
            output_resolution: None,
            offload: Offload::None,
            random: None,
        }
    }

    /// Where the text encoders live and run.
    pub fn encoder_device(&self) -> Device {
        match self.offload {
            Offload::None => self.device,
            Offload::Encoders | Offload::EncodersAndVae => Device::Cpu,
        }
    }

    /// Where the VAE lives and runs.
    pub fn vae_device(&self) -> Device {
        match self.offload {
            Offload::EncodersAndVae => Device::Cpu,
            Offload::None | Offload::Encoders => self.device,
        }
    }
}

/// [`FlowPipeline`]'s `dir`, `scheduler`, `denoiser` and `denoiser_mut` for a pipeline with fields
/// `dir`, `scheduler` and `transformer`.
macro_rules! pipeline_parts {
    () => {
        fn dir(&self) -> &$crate::pipeline::PipelineDir {
            &self.dir
        }

        fn scheduler(&self) -> &flowtune_sampling::SchedulerConfig {
            &self.scheduler
        }

        fn denoiser(&self) -> &dyn $crate::denoiser::TrainableDenoiser {
            &self.transformer
        }

        fn denoiser_mut(&mut self) -> &mut dyn $crate::denoiser::TrainableDenoiser {
            &mut self.transformer
        }
    };
}
pub(crate) use pipeline_parts;

/// A loaded pipeline of some family: everything above `flowtune-models` goes through this.
pub trait FlowPipeline {
    /// The directory it was loaded from.
    fn dir(&self) -> &PipelineDir;
    /// Where its tensors live.
    fn device(&self) -> Device;
    /// The flow-matching scheduler's settings (`scheduler/scheduler_config.json`).
    fn scheduler(&self) -> &SchedulerConfig;
    /// The denoiser and its adapters.
    fn denoiser(&self) -> &dyn TrainableDenoiser;
    fn denoiser_mut(&mut self) -> &mut dyn TrainableDenoiser;

    /// Text conditioning of `prompts`, one row each.
    fn encode_prompts(&self, prompts: &[&str]) -> Result<TextConditioning, ModelError>;

    /// The latent shape of one sample without the batch dimension, for an image of
    /// `height × width` pixels: `[C, H, W]` for images, `[C, F, H, W]` for video. The error says
    /// which sizes are allowed.
    fn latent_shape(&self, height: i64, width: i64) -> Result<Vec<i64>, ModelError>;

    /// What the sigma grid of `steps` steps is built from for latents of `latent_shape`
    /// (the family's schedule, and the image token count where the shift is dynamic).
    fn grid_request(&self, steps: usize, latent_shape: &[i64]) -> GridRequest;

    /// Clean latents (B, …) → u8 RGB pictures (B, H, W, 3) on the latents' device; a video family
    /// lays its frames side by side.
    fn decode_rgb8(&self, latents: &Tensor) -> Result<Tensor, ModelError>;

    /// The sound of clean latents, one waveform per row, for a family with an audio stream
    /// (LTX-2); `None` for a silent one.
    fn decode_audio(&self, latents: &Tensor) -> Result<Option<Vec<Waveform>>, ModelError> {
        let _ = latents;
        Ok(None)
    }

    /// u8 RGB pictures (B, H, W, 3) → clean latents (f32), the inverse of [`Self::decode_rgb8`].
    fn encode_rgb8(&self, images: &Tensor) -> Result<Tensor, ModelError>;

    /// Text conditioning of `prompts` that all share the condition `pictures`, for samples of
    /// `latent_shape` (image editing: Qwen-Image-Edit-Plus; image-to-video: Wan2.2-TI2V's first
    /// frame). Without pictures it is [`Self::encode_prompts`]; a family that takes none refuses
    /// them, and one that takes no alpha ([`Self::takes_alpha`]) refuses a translucent one.
    fn encode_prompts_with_pictures(
        &self,
        prompts: &[&str],
        pictures: &[RgbaImage],
        latent_shape: &[i64],
    ) -> Result<TextConditioning, ModelError> {
        let _ = latent_shape;
        if pictures.is_empty() {
            return self.encode_prompts(prompts);
        }
        Err(ModelError::Input(format!(
            "{}: a {} takes no condition pictures",
            self.dir().root.display(),
            self.dir().index.class_name
        )))
    }

    /// What condition `pictures` add to each of `rows` prompts' conditioning besides the prompt
    /// states (their VAE tokens and layout), for stand-in prompts ([`crate::StandInText`]). A
    /// family whose pictures reach the denoiser through the text encoder alone refuses.
    fn picture_extras(
        &self,
        pictures: &[RgbaImage],
        rows: usize,
    ) -> Result<BTreeMap<String, Tensor>, ModelError> {
        let _ = (pictures, rows);
        Err(ModelError::Input(format!(
            "{}: a {}'s condition pictures need its text encoder, which random weights replace \
             by stand-in embeddings",
            self.dir().root.display(),
            self.dir().index.class_name
        )))
    }

    /// Adds what every row's conditioning carries besides the prompt (LTX-2: the sample's latent
    /// video size and frame rate); [`crate::StandInText`] calls it on its stand-in embeddings.
    fn sample_conditioning(&self, text: &mut TextConditioning) -> Result<(), ModelError> {
        let _ = text;
        Ok(())
    }

    /// Whether condition pictures reach the family with their alpha (Qwen-Image 2.1); the others
    /// take opaque pictures only ([`crate::pictures::opaque_rgb`]).
    fn takes_alpha(&self) -> bool {
        false
    }

    /// Whether the family sizes condition pictures by [`PipelineOptions::output_resolution`]
    /// (Qwen-Image 2.1); it is refused where it does not.
    fn takes_output_resolution(&self) -> bool {
        false
    }

    /// Whether the denoiser takes a distilled guidance value through an embedding (FLUX.1 [dev]);
    /// [`PipelineOptions::embedded_guidance`] is refused where it does not.
    fn embeds_guidance(&self) -> bool {
        false
    }

    /// Whether the family samples video and reads [`PipelineOptions::num_frames`]; it is refused
    /// where it does not.
    fn takes_num_frames(&self) -> bool {
        false
    }

    /// Whether the family reads [`PipelineOptions::frame_rate`] (one with sound); it is refused
    /// where it does not.
    fn takes_frame_rate(&self) -> bool {
        false
    }

    /// How many frames [`Self::decode_rgb8`] lays side by side for latents of `latent_shape`: 1
    /// for pictures; by default a video latent `[C, F, H, W]` decodes to its F frames (a video VAE
    /// with temporal compression says its own count).
    fn decoded_frames(&self, latent_shape: &[i64]) -> usize {
        match latent_shape {
            [_, frames, _, _] => *frames as usize,
            _ => 1,
        }
    }

    /// The negative prompt of CFG when a prompt row names none (diffusers' pipeline default:
    /// empty for SD3, `" "` for Qwen-Image).
    fn default_negative_prompt(&self) -> &'static str {
        ""
    }

    /// The folder of the denoiser's diffusers component (its `config.json` goes beside a fully
    /// fine-tuned export).
    fn denoiser_dir(&self) -> PathBuf {
        self.dir().root.join(self.denoiser().lora_prefix())
    }

    /// The components full pre-training trains (the denoiser and the text encoders learned with
    /// it), as (folder, weights file, store), in the diffusers layout.
    fn trained_stores(&self) -> Vec<(&'static str, &'static str, &VarStore)>;
}

/// `[channels, height / factor, width / factor]` of a VAE-latent family whose sides must be
/// multiples of `factor × patch`; the error names the side and the multiple.
pub fn image_latent_shape(
    height: i64,
    width: i64,
    channels: i64,
    factor: i64,
    patch: i64,
) -> Result<Vec<i64>, ModelError> {
    let multiple = factor * patch;
    for side in [height, width] {
        if side <= 0 || side % multiple != 0 {
            return Err(ModelError::Input(format!(
                "{side}: expected a positive multiple of {multiple} (VAE factor × patch size)"
            )));
        }
    }
    Ok(vec![channels, height / factor, width / factor])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offload_puts_encoders_then_the_vae_on_the_cpu() {
        let on = |offload| PipelineOptions { offload, ..PipelineOptions::new(Device::Cuda(0)) };
        let places = |o: PipelineOptions| (o.encoder_device(), o.vae_device());
        assert_eq!(places(on(Offload::None)), (Device::Cuda(0), Device::Cuda(0)));
        assert_eq!(places(on(Offload::Encoders)), (Device::Cpu, Device::Cuda(0)));
        assert_eq!(places(on(Offload::EncodersAndVae)), (Device::Cpu, Device::Cpu));
    }
}
