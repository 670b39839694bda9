//! The rollout engine over any registered pipeline: prompts encoded once per prompt and repeated
//! for its copies, per-row seeds and SDE windows, a recorded trajectory, decoded images — and the
//! replay of a recorded step, the same function of the same inputs, so its log-prob equals the
//! rollout's.

use std::ops::Range;

use flowtune_models::{
    generated_frames, guided_velocity, CfgScale, Denoiser, FlowPipeline, ModelError,
    TextConditioning, Waveform,
};
use flowtune_sampling::{
    reverse_step_over, row_seed, DeviceGrid, Draw, SampleNoise, SamplerConfig, SigmaGrid,
    StepOutput,
};
use image::{RgbImage, RgbaImage};
use tch::{Device, Tensor};

use crate::rows::Rows;
use crate::{
    sample_trajectory, Guidance, PromptCache, RolloutError, Trajectory, TrajectoryRequest,
};

/// One step's rollout: what the trainer replays and what the rewards score.
pub struct RolloutBatch {
    pub text: TextConditioning,
    pub negative: Option<TextConditioning>,
    pub windows: Vec<Range<usize>>,
    pub trajectory: Trajectory,
    pub images: Vec<RgbImage>,
    /// Each row's sound, for a family with an audio stream (LTX-2); empty for a silent one.
    pub audio: Vec<Waveform>,
}

/// What receives each chunk's decoded rows: the first row's index, the images and their sounds.
pub type OnDecoded<'a> = dyn FnMut(usize, &[RgbImage], &[Waveform]) + 'a;

/// Sampler state shared by rollout and replay.
pub struct Engine<'a> {
    pub pipe: &'a dyn FlowPipeline,
    pub sampler: &'a SamplerConfig,
    pub grid: SigmaGrid,
    /// The grid on the pipeline's device, for replays.
    device_grid: DeviceGrid,
    /// One sample's latent shape (no batch dimension), from [`FlowPipeline::latent_shape`].
    pub latent_shape: Vec<i64>,
    pub seed: u64,
    /// Embeddings of the prompts seen so far.
    prompts: PromptCache,
}

/// Text conditioning of `prompts` (one row each), encoding each distinct prompt once; with
/// `pictures` (one set per row, or none at all) each row is conditioned on its set too (image
/// editing, image-to-video for samples of `latent_shape`), rows sharing a set and a prompt
/// encoded once. Each prompt is encoded on its own, so its embedding does not depend on which
/// other prompts share the batch: a rank holding some of a step's prompts encodes them exactly
/// as one process holding all of them does. Prompts without pictures go through `cache` when given.
pub fn encode_rows(
    pipe: &dyn FlowPipeline,
    prompts: &[&str],
    pictures: &[Vec<RgbaImage>],
    latent_shape: &[i64],
    cache: Option<&PromptCache>,
) -> Result<TextConditioning, ModelError> {
    if !pictures.is_empty() && pictures.len() != prompts.len() {
        return Err(ModelError::Input(format!(
            "{} picture sets for {} prompts",
            pictures.len(),
            prompts.len()
        )));
    }
    let none: &[RgbaImage] = &[];
    let mut sets: Vec<&[RgbaImage]> = vec![];
    let mut unique: Vec<(usize, &str)> = vec![];
    let keys: Vec<(usize, &str)> = prompts
        .iter()
        .enumerate()
        .map(|(row, &prompt)| {
            let set = pictures.get(row).map_or(none, Vec::as_slice);
            let s = sets.iter().position(|&known| known == set).unwrap_or_else(|| {
                sets.push(set);
                sets.len() - 1
            });
            if !unique.contains(&(s, prompt)) {
                unique.push((s, prompt));
            }
            (s, prompt)
        })
        .collect();
    let parts = unique
        .iter()
        .map(|&(s, prompt)| {
            let encode = || {
                tch::no_grad(|| pipe.encode_prompts_with_pictures(&[prompt], sets[s], latent_shape))
            };
            match cache {
                Some(cache) if sets[s].is_empty() => {
                    cache.get_or_encode(prompt, pipe.device(), encode)
                }
                _ => encode(),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let encoded = TextConditioning::stack(parts)?;
    let index: Vec<i64> =
        keys.iter().map(|k| unique.iter().position(|u| u == k).expect("encoded") as i64).collect();
    Ok(encoded.rows(&Tensor::from_slice(&index).to_device(encoded.embeds.device())))
}

/// Gives every row the initial noise of the first row with its prompt and pictures.
fn share_initial_noise(streams: &mut [SampleNoise], prompts: &[&str], pictures: &[Vec<RgbaImage>]) {
    let none = vec![];
    let key = |r: usize| (prompts[r], pictures.get(r).unwrap_or(&none));
    for row in 1..streams.len() {
        if let Some(first) = (0..row).find(|&f| key(f) == key(row)) {
            streams[row].initial = streams[first].initial.shallow_clone();
        }
    }
}

impl<'a> Engine<'a> {
    /// An engine sampling latents of `latent_shape` (see [`FlowPipeline::latent_shape`]) on the
    /// grid the pipeline asks for. `guidance_scale_2` is refused for a single denoiser.
    pub fn new(
        pipe: &'a dyn FlowPipeline,
        sampler: &'a SamplerConfig,
        latent_shape: Vec<i64>,
        seed: u64,
    ) -> Result<Self, RolloutError> {
        if let (Some(g), None) = (sampler.guidance_scale_2, pipe.denoiser().expert_boundary()) {
            return Err(RolloutError::Input(format!(
                "guidance_scale_2 {g} (rollout.guidance_scale_2 / --guidance-2) is the low-noise \
                 expert's CFG scale of a two-expert pipeline (Wan2.2-A14B); {} ({}) has one \
                 denoiser",
                pipe.dir().root.display(),
                pipe.dir().index.class_name
            )));
        }
        let grid =
            SigmaGrid::new(pipe.scheduler(), &pipe.grid_request(sampler.steps, &latent_shape))?;
        let device_grid = DeviceGrid::new(&grid, pipe.device());
        Ok(Self {
            pipe,
            sampler,
            grid,
            device_grid,
            latent_shape,
            seed,
            prompts: Default::default(),
        })
    }

    /// The engine sampling on `grid` instead of the pipeline's (a few-step student's sigmas).
    pub fn with_grid(mut self, grid: SigmaGrid) -> Self {
        self.device_grid = DeviceGrid::new(&grid, self.pipe.device());
        self.grid = grid;
        self
    }

    /// The sampler's CFG scales.
    pub fn cfg_scale(&self) -> CfgScale {
        CfgScale { scale: self.sampler.guidance_scale, scale_2: self.sampler.guidance_scale_2 }
    }

    /// The training seeds of `rows` rows at step `step` (1-based): `row_seed(seed, step, r)`.
    pub fn row_seeds(&self, rows: usize, step: u64) -> Vec<u64> {
        (0..rows as u64).map(|r| row_seed(self.seed, step, r)).collect()
    }

    /// Samples every row from its own seed; `step` (1-based) drives the SDE-window strategies.
    /// `pictures` are the rows' condition pictures (image editing), or empty.
    pub fn rollout(
        &self,
        prompts: &[&str],
        negatives: &[&str],
        pictures: &[Vec<RgbaImage>],
        seeds: &[u64],
        step: u64,
    ) -> Result<RolloutBatch, RolloutError> {
        self.rollout_streaming(prompts, negatives, pictures, seeds, step, &mut |_, _, _| {})
    }

    /// [`Self::rollout`], handing each chunk's images and sounds to `on_images(first row,
    /// images, sounds)` as soon as they are decoded (no sounds for a silent family).
    pub fn rollout_streaming(
        &self,
        prompts: &[&str],
        negatives: &[&str],
        pictures: &[Vec<RgbaImage>],
        seeds: &[u64],
        step: u64,
        on_images: &mut OnDecoded<'_>,
    ) -> Result<RolloutBatch, RolloutError> {
        if seeds.len() != prompts.len() {
            return Err(RolloutError::Input(format!(
                "{} seeds for {} prompts",
                seeds.len(),
                prompts.len()
            )));
        }
        let cache = Some(&self.prompts);
        let text = encode_rows(self.pipe, prompts, pictures, &self.latent_shape, cache)?;
        let guided = self.pipe.denoiser().runs_cfg(self.sampler.guidance_scale);
        // The negative side sees the same pictures, as in diffusers' edit pipelines.
        let negative = if guided {
            Some(encode_rows(self.pipe, negatives, pictures, &self.latent_shape, cache)?)
        } else {
            None
        };
        let mut shape = vec![1];
        shape.extend(&self.latent_shape);
        let device = self.pipe.device();
        let mut streams = seeds
            .iter()
            .map(|&seed| SampleNoise::new(self.sampler, seed, step, &shape, device))
            .collect::<Result<Vec<_>, _>>()?;
        if self.sampler.same_noise {
            share_initial_noise(&mut streams, prompts, pictures);
        }
        let windows: Vec<Range<usize>> = streams.iter().map(|s| s.window.clone()).collect();
        // Rows go through the model `rollout.batch_size` at a time, independent of the group size.
        let chunk =
            if self.sampler.batch_size == 0 { prompts.len() } else { self.sampler.batch_size };
        let mut parts = vec![];
        let (mut images, mut audio) = (vec![], vec![]);
        for (i, streams) in streams.chunks_mut(chunk).enumerate() {
            let (a, n) = ((i * chunk) as i64, streams.len() as i64);
            let initial = Tensor::cat(
                &streams.iter().map(|s| s.initial.shallow_clone()).collect::<Vec<_>>(),
                0,
            );
            let text = text.narrow(a, n);
            let negative = negative.as_ref().map(|c| c.narrow(a, n));
            let request = TrajectoryRequest {
                grid: &self.grid,
                text: &text,
                guidance: Guidance {
                    scale: self.sampler.guidance_scale,
                    scale_2: self.sampler.guidance_scale_2,
                    negative: negative.as_ref(),
                },
                step: self.sampler.step_params(self.grid.sigmas[1] as f64),
                windows: &windows[a as usize..(a + n) as usize],
                initial: &initial,
            };
            let part = tch::no_grad(|| {
                sample_trajectory(self.pipe.denoiser(), &request, |_| {
                    Tensor::cat(&streams.iter_mut().map(|s| s.step_noise()).collect::<Vec<_>>(), 0)
                })
            })?;
            let decoded = tch::no_grad(|| self.decode(&part.final_latents))?;
            let sounds = tch::no_grad(|| self.decode_audio(&part.final_latents))?;
            on_images(a as usize, &decoded, &sounds);
            images.extend(decoded);
            audio.extend(sounds);
            parts.push(part);
        }
        let cat = |f: fn(&Trajectory) -> &Tensor| {
            Tensor::cat(&parts.iter().map(f).collect::<Vec<_>>(), 0)
        };
        let trajectory = Trajectory {
            all_latents: cat(|t| &t.all_latents),
            all_log_probs: cat(|t| &t.all_log_probs),
            all_timesteps: cat(|t| &t.all_timesteps),
            final_latents: cat(|t| &t.final_latents),
        };
        Ok(RolloutBatch { text, negative, windows, trajectory, images, audio })
    }

    /// u8 RGB images of clean latents.
    pub fn decode(&self, latents: &Tensor) -> Result<Vec<RgbImage>, RolloutError> {
        let rgb = self.pipe.decode_rgb8(latents)?.to_device(Device::Cpu);
        let (b, h, w, _) = rgb.size4()?;
        (0..b)
            .map(|i| {
                let bytes = Vec::<u8>::try_from(rgb.get(i).flatten(0, -1))?;
                RgbImage::from_raw(w as u32, h as u32, bytes)
                    .ok_or_else(|| RolloutError::Input("decoded image has the wrong size".into()))
            })
            .collect()
    }

    /// The sound of clean latents, one waveform per row; none for a silent family.
    pub fn decode_audio(&self, latents: &Tensor) -> Result<Vec<Waveform>, RolloutError> {
        Ok(self.pipe.decode_audio(latents)?.unwrap_or_default())
    }

    /// Replays window step `j` of `rows` with the current weights: CFG velocity, then the step's
    /// log-density of the recorded next latent.
    pub fn replay(
        &self,
        batch: &RolloutBatch,
        rows: &Rows,
        j: i64,
    ) -> Result<StepOutput, RolloutError> {
        self.replay_with(self.pipe.denoiser(), batch, rows, j)
    }

    /// [`Self::replay`] with another denoiser (the reference).
    pub fn replay_with<D: Denoiser + ?Sized>(
        &self,
        model: &D,
        batch: &RolloutBatch,
        rows: &Rows,
        j: i64,
    ) -> Result<StepOutput, RolloutError> {
        let t = &batch.trajectory;
        let index = &rows.device;
        let x = t.all_latents.index_select(0, index).select(1, j);
        let next = t.all_latents.index_select(0, index).select(1, j + 1);
        let tt = t.all_timesteps.index_select(0, index).select(1, j);
        let (sigma, sigma_next) = self.device_grid.step_sigmas(&tt);
        let negative = batch.negative.as_ref().map(|n| n.rows_at(&rows.host));
        let text = batch.text.rows_at(&rows.host);
        let v = guided_velocity(model, &x, &tt, &text, negative.as_ref(), self.cfg_scale())?;
        let params = self.sampler.step_params(self.grid.sigmas[1] as f64);
        let generated = text.held_latents().map(|h| generated_frames(&x, h));
        let given = Draw::Given(&next);
        Ok(reverse_step_over(&params, &v, &x, &sigma, &sigma_next, given, generated.as_ref())?)
    }
}
