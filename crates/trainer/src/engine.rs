//! The rollout engine for an SD3 pipeline: prompts encoded once per prompt and repeated for its
//! copies, per-row seeds and SDE windows, a recorded trajectory, decoded images — and the replay of
//! a recorded step, the same function of the same inputs, so its log-prob equals the rollout's.

use std::ops::Range;

use flowtune_models::sd3::{Sd3Pipeline, Sd3Transformer};
use flowtune_models::{Denoiser, ModelError, TextConditioning};
use flowtune_rewards::RgbImage;
use flowtune_rollout::{sample_trajectory, Guidance, RolloutError, Trajectory, TrajectoryRequest};
use flowtune_sampling::{
    reverse_step, row_seed, Draw, SampleNoise, SamplerConfig, SigmaGrid, StepOutput,
};
use tch::{Device, Kind, Tensor};

use crate::TrainError;

/// One step's rollout: what the trainer replays and what the rewards score.
pub struct RolloutBatch {
    pub text: TextConditioning,
    pub negative: Option<TextConditioning>,
    pub windows: Vec<Range<usize>>,
    pub trajectory: Trajectory,
    pub images: Vec<RgbImage>,
}

/// Sampler state shared by rollout and replay.
pub struct Engine<'a> {
    pub pipe: &'a Sd3Pipeline,
    pub sampler: &'a SamplerConfig,
    pub grid: SigmaGrid,
    pub latent_shape: [i64; 3],
    pub seed: u64,
}

/// Text conditioning of `prompts` (one row each), encoding each distinct prompt once.
pub fn encode_rows(pipe: &Sd3Pipeline, prompts: &[&str]) -> Result<TextConditioning, ModelError> {
    let mut unique: Vec<&str> = vec![];
    let index: Vec<i64> = prompts
        .iter()
        .map(|p| match unique.iter().position(|u| u == p) {
            Some(i) => i as i64,
            None => {
                unique.push(p);
                unique.len() as i64 - 1
            }
        })
        .collect();
    let encoded = tch::no_grad(|| pipe.encode_prompts(&unique))?;
    let idx = Tensor::from_slice(&index).to_device(encoded.embeds.device());
    Ok(TextConditioning {
        embeds: encoded.embeds.index_select(0, &idx),
        pooled: encoded.pooled.map(|p| p.index_select(0, &idx)),
    })
}

impl<'a> Engine<'a> {
    /// Latents are `resolution / VAE factor` on a side.
    pub fn new(
        pipe: &'a Sd3Pipeline,
        sampler: &'a SamplerConfig,
        resolution: i64,
        seed: u64,
    ) -> Result<Self, TrainError> {
        let factor = pipe.vae_scale_factor();
        let multiple = factor * pipe.transformer.config.patch_size;
        if resolution <= 0 || resolution % multiple != 0 {
            return Err(TrainError::Invalid(format!(
                "model.resolution {resolution}: expected a positive multiple of {multiple} (VAE factor × patch size)"
            )));
        }
        let side = resolution / factor;
        let grid = SigmaGrid::new(
            &pipe.scheduler,
            &flowtune_sampling::GridRequest { steps: sampler.steps, ..Default::default() },
        )?;
        Ok(Self {
            pipe,
            sampler,
            grid,
            latent_shape: [pipe.transformer.config.in_channels, side, side],
            seed,
        })
    }

    fn device(&self) -> Device {
        self.pipe.transformer.context_embedder.weight.device()
    }

    /// The training seeds of `rows` rows at step `step` (1-based): `row_seed(seed, step, r)`.
    pub fn row_seeds(&self, rows: usize, step: u64) -> Vec<u64> {
        (0..rows as u64).map(|r| row_seed(self.seed, step, r)).collect()
    }

    /// Samples every row from its own seed; `step` (1-based) drives the SDE-window strategies.
    pub fn rollout(
        &self,
        prompts: &[&str],
        negatives: &[&str],
        seeds: &[u64],
        step: u64,
    ) -> Result<RolloutBatch, TrainError> {
        self.rollout_streaming(prompts, negatives, seeds, step, &mut |_, _| {})
    }

    /// [`Self::rollout`], handing each chunk's images to `on_images(first row, images)` as soon
    /// as they are decoded.
    pub fn rollout_streaming(
        &self,
        prompts: &[&str],
        negatives: &[&str],
        seeds: &[u64],
        step: u64,
        on_images: &mut dyn FnMut(usize, &[RgbImage]),
    ) -> Result<RolloutBatch, TrainError> {
        if seeds.len() != prompts.len() {
            return Err(TrainError::Invalid(format!(
                "{} seeds for {} prompts",
                seeds.len(),
                prompts.len()
            )));
        }
        let text = encode_rows(self.pipe, prompts)?;
        let guided = self.sampler.guidance_scale > 1.0;
        let negative = if guided { Some(encode_rows(self.pipe, negatives)?) } else { None };
        let [c, h, w] = self.latent_shape;
        let mut streams = seeds
            .iter()
            .map(|&seed| SampleNoise::new(self.sampler, seed, step, &[1, c, h, w], self.device()))
            .collect::<Result<Vec<_>, _>>()?;
        let windows: Vec<Range<usize>> = streams.iter().map(|s| s.window.clone()).collect();
        // Rows go through the model `rollout.batch_size` at a time, independent of the group size.
        let chunk =
            if self.sampler.batch_size == 0 { prompts.len() } else { self.sampler.batch_size };
        let rows_of = |c: &TextConditioning, a: i64, n: i64| TextConditioning {
            embeds: c.embeds.narrow(0, a, n),
            pooled: c.pooled.as_ref().map(|p| p.narrow(0, a, n)),
        };
        let mut parts = vec![];
        let mut images = vec![];
        for (i, streams) in streams.chunks_mut(chunk).enumerate() {
            let (a, n) = ((i * chunk) as i64, streams.len() as i64);
            let initial = Tensor::cat(
                &streams.iter().map(|s| s.initial.shallow_clone()).collect::<Vec<_>>(),
                0,
            );
            let text = rows_of(&text, a, n);
            let negative = negative.as_ref().map(|c| rows_of(c, a, n));
            let request = TrajectoryRequest {
                grid: &self.grid,
                text: &text,
                guidance: Guidance {
                    scale: self.sampler.guidance_scale,
                    negative: negative.as_ref(),
                },
                step: self.sampler.step_params(self.grid.sigmas[1] as f64),
                windows: &windows[a as usize..(a + n) as usize],
                initial: &initial,
            };
            let part = tch::no_grad(|| {
                sample_trajectory(&self.pipe.transformer, &request, |_| {
                    Tensor::cat(&streams.iter_mut().map(|s| s.step_noise()).collect::<Vec<_>>(), 0)
                })
            })?;
            let decoded = tch::no_grad(|| self.decode(&part.final_latents))?;
            on_images(a as usize, &decoded);
            images.extend(decoded);
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
        Ok(RolloutBatch { text, negative, windows, trajectory, images })
    }

    /// u8 RGB images of clean latents.
    pub fn decode(&self, latents: &Tensor) -> Result<Vec<RgbImage>, TrainError> {
        let rgb = self.pipe.decode_rgb8(latents).to_device(Device::Cpu);
        let (b, h, w, _) = rgb.size4()?;
        (0..b)
            .map(|i| {
                let bytes = Vec::<u8>::try_from(rgb.get(i).flatten(0, -1))?;
                RgbImage::from_raw(w as u32, h as u32, bytes)
                    .ok_or_else(|| TrainError::Invalid("decoded image has the wrong size".into()))
            })
            .collect()
    }

    /// Replays window step `j` of `rows` with the current weights: CFG velocity, then the step's
    /// log-density of the recorded next latent.
    pub fn replay(
        &self,
        batch: &RolloutBatch,
        rows: &Tensor,
        j: i64,
    ) -> Result<StepOutput, TrainError> {
        self.replay_with(&self.pipe.transformer, batch, rows, j)
    }

    /// [`Self::replay`] with another denoiser (a frozen reference copy).
    pub fn replay_with(
        &self,
        model: &Sd3Transformer,
        batch: &RolloutBatch,
        rows: &Tensor,
        j: i64,
    ) -> Result<StepOutput, TrainError> {
        let t = &batch.trajectory;
        let x = t.all_latents.index_select(0, rows).select(1, j);
        let next = t.all_latents.index_select(0, rows).select(1, j + 1);
        let timesteps = Vec::<f32>::try_from(
            t.all_timesteps.index_select(0, rows).select(1, j).to_device(Device::Cpu),
        )?;
        let (mut sigma, mut sigma_next) = (vec![], vec![]);
        for ts in &timesteps {
            let (s, sn) = self.grid.step_sigmas(*ts)?;
            sigma.push(s);
            sigma_next.push(sn);
        }
        let device = x.device();
        let tt = Tensor::from_slice(&timesteps).to_device(device);
        let text = batch.text.rows(rows);
        let v = match &batch.negative {
            Some(neg) => {
                let both = neg.rows(rows).concat(&text);
                let out = model
                    .velocity(&Tensor::cat(&[&x, &x], 0), &Tensor::cat(&[&tt, &tt], 0), &both)?
                    .to_kind(Kind::Float);
                let parts = out.chunk(2, 0);
                &parts[0] + (&parts[1] - &parts[0]) * self.sampler.guidance_scale
            }
            None => model.velocity(&x, &tt, &text)?.to_kind(Kind::Float),
        };
        let params = self.sampler.step_params(self.grid.sigmas[1] as f64);
        Ok(reverse_step(
            &params,
            &v,
            &x,
            &Tensor::from_slice(&sigma),
            &Tensor::from_slice(&sigma_next),
            Draw::Given(&next),
        )?)
    }
}

/// The conditional velocity (no CFG) at noise level `sigma` (B,), in f32: what the
/// forward-process losses (DPO, NFT) train.
pub fn velocity_at(
    model: &Sd3Transformer,
    x: &Tensor,
    sigma: &Tensor,
    text: &TextConditioning,
) -> Result<Tensor, TrainError> {
    let timesteps = sigma * 1000.0;
    Ok(model.velocity(x, &timesteps, text)?.to_kind(Kind::Float))
}

impl From<RolloutError> for TrainError {
    fn from(e: RolloutError) -> Self {
        TrainError::Rollout(e.to_string())
    }
}
