//! Models at real size without weight files (`--random-weights`): every component is built from
//! its `config.json` in its final dtype on its final device, as for loading, and each variable is
//! then filled in place there with seeded random values instead of being read from safetensors —
//! no files, no host copy. Text encoders are not built at all: prompts become seeded random
//! embeddings of the denoiser's real text width and a stated token length ([`StandInText`]).
//!
//! Values keep activations near unit scale through any depth: matrices and convolutions
//! `N(0, 1/fan_in)`, 1-D weights (norm scales) 1, biases 0, other floating tensors `N(0, 0.02²)`,
//! integer tensors 0. Each variable's values depend only on the seed and its name, so the same
//! seed gives the same weights whatever else the model holds.

use std::cell::Cell;
use std::path::PathBuf;

use flowtune_sampling::{GridRequest, SchedulerConfig};
use image::RgbaImage;
use tch::nn::VarStore;
use tch::{Device, Tensor};

use crate::audio::Waveform;
use crate::denoiser::{ExampleShape, TrainableDenoiser};
use crate::family::{FlowPipeline, PipelineOptions};
use crate::pipeline::PipelineDir;
use crate::{ModelError, TextConditioning};

/// Random weights instead of checkpoint files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RandomWeights {
    /// Seed of every weight and prompt embedding.
    pub seed: u64,
    /// Text tokens of every prompt's stand-in embedding (negative prompts too; no padding).
    pub text_tokens: i64,
}

thread_local! {
    static SEED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Runs `f` with weight loading on this thread replaced by seeded random values
/// ([`crate::load_weights`] fills, [`crate::weights::checkpoint_files`] reads no folder).
pub fn with_random_weights<T>(seed: u64, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<u64>);
    impl Drop for Restore {
        fn drop(&mut self) {
            SEED.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SEED.with(|s| s.replace(Some(seed))));
    f()
}

/// The seed weights are drawn from on this thread, when loading is random.
pub(crate) fn active_seed() -> Option<u64> {
    SEED.with(Cell::get)
}

/// FNV-1a of `name` mixed with `seed`: a variable's own seed.
fn name_seed(seed: u64, name: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h & (i64::MAX as u64)
}

/// Fills every variable of `store` in place on its device (torch's generators are reseeded per
/// variable; rollout noise does not use them).
pub(crate) fn fill(store: &VarStore, seed: u64) -> Result<(), ModelError> {
    let _guard = tch::no_grad_guard();
    let mut vars: Vec<(String, Tensor)> = store.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, var) in vars {
        let mut var = var.shallow_clone();
        if !var.is_floating_point() {
            let _ = var.f_zero_()?;
            continue;
        }
        let size = var.size();
        // Norms start as the identity (a batch norm's statistics too: a random variance could
        // be negative).
        if name.ends_with("bias") || name.ends_with("running_mean") {
            let _ = var.f_zero_()?;
        } else if size.len() == 1 && (name.ends_with("weight") || name.ends_with("running_var")) {
            let _ = var.f_fill_(1.0)?;
        } else {
            let std = if size.len() >= 2 && name.ends_with("weight") {
                1.0 / (size[1..].iter().product::<i64>().max(1) as f64).sqrt()
            } else {
                0.02
            };
            tch::manual_seed(name_seed(seed, &name) as i64);
            let _ = var.f_normal_(0.0, std)?;
        }
    }
    Ok(())
}

/// The text encoders `load` builds, or none when `options` ask for random weights (prompts then
/// go through [`StandInText`]).
pub(crate) fn text_encoders<T>(
    options: &PipelineOptions,
    load: impl FnOnce() -> Result<T, ModelError>,
) -> Result<Option<T>, ModelError> {
    match options.random {
        Some(_) => Ok(None),
        None => load().map(Some),
    }
}

/// A pipeline's text encoders, or the error of one built with random weights asked to encode
/// prompts itself.
pub(crate) fn built<'a, T>(text: &'a Option<T>, dir: &PipelineDir) -> Result<&'a T, ModelError> {
    text.as_ref().ok_or_else(|| {
        ModelError::Input(format!(
            "{}: built with random weights and no text encoder; prompts go through StandInText",
            dir.root.display()
        ))
    })
}

/// A pipeline loaded with random weights and no text encoders: prompts are encoded as seeded
/// random embeddings of the denoiser's text width, `text_tokens` long, with the conditioning's
/// other parts (pooled vectors, masks, extras) shaped as the denoiser takes them. A prompt's
/// embedding depends only on the seed and its text.
pub struct StandInText {
    pub inner: Box<dyn FlowPipeline>,
    pub random: RandomWeights,
}

impl StandInText {
    fn embed(&self, prompt: &str) -> TextConditioning {
        let text_len = self.random.text_tokens;
        let shape = ExampleShape { batch: 1, frames: 1, height: 2, width: 2, text_len };
        let template = tch::no_grad(|| self.inner.denoiser().example_inputs(shape).text);
        let seed = name_seed(self.random.seed, prompt) as i64;
        tch::manual_seed(seed);
        template
            .map_rows(|t| if t.is_floating_point() { t.randn_like() } else { t.shallow_clone() })
    }
}

impl FlowPipeline for StandInText {
    fn dir(&self) -> &PipelineDir {
        self.inner.dir()
    }

    fn device(&self) -> Device {
        self.inner.device()
    }

    fn scheduler(&self) -> &SchedulerConfig {
        self.inner.scheduler()
    }

    fn denoiser(&self) -> &dyn TrainableDenoiser {
        self.inner.denoiser()
    }

    fn denoiser_mut(&mut self) -> &mut dyn TrainableDenoiser {
        self.inner.denoiser_mut()
    }

    fn encode_prompts(&self, prompts: &[&str]) -> Result<TextConditioning, ModelError> {
        let rows: Vec<TextConditioning> = prompts.iter().map(|p| self.embed(p)).collect();
        let first = rows.first().ok_or_else(|| ModelError::Input("no prompts to encode".into()))?;
        let mut all =
            rows[1..].iter().fold(first.map_rows(Tensor::shallow_clone), |a, b| a.concat(b));
        self.inner.sample_conditioning(&mut all)?;
        Ok(all)
    }

    fn sample_conditioning(&self, text: &mut TextConditioning) -> Result<(), ModelError> {
        self.inner.sample_conditioning(text)
    }

    fn latent_shape(&self, height: i64, width: i64) -> Result<Vec<i64>, ModelError> {
        self.inner.latent_shape(height, width)
    }

    fn grid_request(&self, steps: usize, latent_shape: &[i64]) -> GridRequest {
        self.inner.grid_request(steps, latent_shape)
    }

    fn decode_rgb8(&self, latents: &Tensor) -> Result<Tensor, ModelError> {
        self.inner.decode_rgb8(latents)
    }

    fn decode_audio(&self, latents: &Tensor) -> Result<Option<Vec<Waveform>>, ModelError> {
        self.inner.decode_audio(latents)
    }

    fn encode_rgb8(&self, images: &Tensor) -> Result<Tensor, ModelError> {
        self.inner.encode_rgb8(images)
    }

    fn embeds_guidance(&self) -> bool {
        self.inner.embeds_guidance()
    }

    fn takes_num_frames(&self) -> bool {
        self.inner.takes_num_frames()
    }

    fn takes_frame_rate(&self) -> bool {
        self.inner.takes_frame_rate()
    }

    fn takes_alpha(&self) -> bool {
        self.inner.takes_alpha()
    }

    fn takes_output_resolution(&self) -> bool {
        self.inner.takes_output_resolution()
    }

    fn decoded_frames(&self, latent_shape: &[i64]) -> usize {
        self.inner.decoded_frames(latent_shape)
    }

    fn default_negative_prompt(&self) -> &'static str {
        self.inner.default_negative_prompt()
    }

    fn denoiser_dir(&self) -> PathBuf {
        self.inner.denoiser_dir()
    }

    fn trained_stores(&self) -> Vec<(&'static str, &'static str, &VarStore)> {
        self.inner.trained_stores()
    }

    /// Stand-in prompts with the pictures' own extras ([`FlowPipeline::picture_extras`]: their
    /// VAE tokens); the stand-in length stands for the prompt with any vision tokens.
    fn encode_prompts_with_pictures(
        &self,
        prompts: &[&str],
        pictures: &[RgbaImage],
        _latent_shape: &[i64],
    ) -> Result<TextConditioning, ModelError> {
        let mut text = self.encode_prompts(prompts)?;
        if !pictures.is_empty() {
            text.extras.extend(self.inner.picture_extras(pictures, prompts.len())?);
        }
        Ok(text)
    }
}
