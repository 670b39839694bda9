//! What both halves of a DMD2 step draw: an attempt's prompts (fresh ones from the loader, this
//! rank's share encoded), the student's samples by backward simulation (deterministic Euler steps
//! from seeded noise down its grid to a random exit step, shared by the attempt, where it predicts
//! the clean sample), and the noise levels and noise its samples are scored at.

use std::ops::Range;

use flowtune_data::{PromptLoader, PromptRecord};
use flowtune_models::{hold_frames, velocity_at_sigma, Denoiser, TextConditioning};
use flowtune_objectives::losses::Dmd2Config;
use flowtune_sampling::{per_row, row_seed, upload, SampleRng};
use tch::{Device, Kind, Tensor};

use crate::run::Run;
use crate::seeds::{DMD2_SAMPLE_SALT, DMD2_SCORE_SALT};
use crate::TrainError;

/// One attempt of a step (the student's update, or one of the fake score's): its prompts and
/// where the student's samples stop.
pub(super) struct Attempt {
    /// Which attempt of the step: 0 the student's, then the fake score's.
    pub index: u64,
    /// Rows of the whole attempt, over all ranks, and their prompts.
    pub rows: usize,
    pub records: Vec<PromptRecord>,
    /// This rank's rows.
    pub local: Range<usize>,
    /// This rank's rows' text, and their negative prompts' (the teacher's guidance).
    pub text: TextConditioning,
    pub negative: Option<TextConditioning>,
    /// The grid index the student's samples stop at: forwards `0..exit` are Euler steps, the
    /// one at `exit` predicts the clean sample.
    pub exit: usize,
}

impl Attempt {
    /// Draws attempt `index` of training step `number` from `loader`: the next prompts, this
    /// rank's share encoded (with the negative prompts when `guided`), and the exit step.
    pub fn draw(
        run: &Run<'_>,
        loader: &mut PromptLoader,
        (number, index): (u64, u64),
        steps: usize,
        guided: bool,
    ) -> Result<Self, TrainError> {
        let rows = loader.next_step();
        let records: Vec<&PromptRecord> = rows.iter().map(|r| loader.record(r)).collect();
        let local = crate::collect::local_rows(run, rows.len());
        let pipe = run.engine.pipe;
        let mine = &records[local.clone()];
        let prompts: Vec<&str> = mine.iter().map(|r| r.prompt.as_str()).collect();
        let alpha = pipe.takes_alpha();
        let pictures = mine.iter().map(|r| r.load_images(alpha)).collect::<Result<Vec<_>, _>>()?;
        let pictures = if pictures.iter().all(Vec::is_empty) { vec![] } else { pictures };
        let shape = &run.engine.latent_shape;
        let encode = |texts: &[&str]| {
            flowtune_rollout::encode_rows(pipe, texts, &pictures, shape, None)
                .map_err(TrainError::from)
        };
        let text = encode(&prompts)?;
        let negative = match guided {
            true => {
                let default = pipe.default_negative_prompt();
                let negatives: Vec<&str> =
                    mine.iter().map(|r| r.negative_prompt.as_deref().unwrap_or(default)).collect();
                Some(encode(&negatives)?)
            }
            false => None,
        };
        let seed = row_seed(run.recipe.seed ^ DMD2_SAMPLE_SALT, number, u64::MAX >> 8) ^ index;
        let exit = SampleRng::new(seed).uniform_int(0, steps - 1);
        let records = records.into_iter().cloned().collect();
        Ok(Self { index, rows: rows.len(), records, local, text, negative, exit })
    }

    /// The stream of row `row` (a position in the whole attempt) under `salt` at step `number`.
    fn stream(&self, seed: u64, salt: u64, number: u64, row: usize) -> SampleRng {
        let row = self.index * (1 << 32) + row as u64;
        SampleRng::new(row_seed(seed ^ salt, number, row))
    }

    /// The student's samples of `rows` (positions in the whole attempt) with `text` (their
    /// rows), without gradient: seeded noise, Euler steps down `sigmas` to the exit step.
    /// Returns the latents at the exit (f32).
    pub fn simulate(
        &self,
        run: &Run<'_>,
        rows: &[usize],
        text: &TextConditioning,
        sigmas: &[f32],
        number: u64,
    ) -> Result<Tensor, TrainError> {
        let model = run.engine.pipe.denoiser();
        let device = run.engine.pipe.device();
        let mut shape = vec![1];
        shape.extend(&run.engine.latent_shape);
        let seed = run.recipe.seed;
        let noise: Vec<Tensor> = rows
            .iter()
            .map(|&r| self.stream(seed, DMD2_SAMPLE_SALT, number, r).normal(&shape, device))
            .collect();
        let mut x = Tensor::cat(&noise, 0);
        if let Some(held) = text.held_latents() {
            x = hold_frames(&x, held);
        }
        tch::no_grad(|| -> Result<Tensor, TrainError> {
            for i in 0..self.exit {
                let v =
                    velocity_at_sigma(model, &x, &sigma_rows(sigmas[i], rows.len(), device), text)?;
                x = &x + &v * (sigmas[i + 1] - sigmas[i]) as f64;
            }
            Ok(x)
        })
    }

    /// The clean prediction `x − σ·v` of the student (with gradient when the caller has it on) at
    /// the exit latents `x` of `rows` rows.
    pub fn predict<D: Denoiser + ?Sized>(
        &self,
        model: &D,
        x: &Tensor,
        text: &TextConditioning,
        sigmas: &[f32],
    ) -> Result<Tensor, TrainError> {
        let sigma = sigmas[self.exit];
        let rows = x.size()[0] as usize;
        let v = velocity_at_sigma(model, x, &sigma_rows(sigma, rows, x.device()), text)?;
        Ok(x - v * sigma as f64)
    }

    /// The scored noise levels (rows,) and noise of `rows`' clean samples `x0` (with `text`,
    /// their rows), and the noised samples `(1 − σ)·x0 + σ·ε`.
    pub fn score_inputs(
        &self,
        run: &Run<'_>,
        rows: &[usize],
        text: &TextConditioning,
        x0: &Tensor,
        config: &Dmd2Config,
        number: u64,
    ) -> (Tensor, Tensor, Tensor) {
        let device = x0.device();
        let mut shape = x0.size();
        shape[0] = 1;
        let (mut sigmas, mut noise) = (vec![], vec![]);
        for &r in rows {
            let mut rng = self.stream(run.recipe.seed, DMD2_SCORE_SALT, number, r);
            let u = rng.uniform_int(0, u32::MAX as usize) as f64 / (u32::MAX as f64 + 1.0);
            sigmas.push(config.score_sigma(u));
            noise.push(rng.normal(&shape, device));
        }
        let sigma = upload(Tensor::from_slice(&sigmas), device);
        let mut noise = Tensor::cat(&noise, 0);
        // Held frames (image-to-video) stay the condition: their noise is the clean latents, so
        // they are not noised, add nothing to the normaliser and have target 0, the velocity the
        // model gives them.
        if let Some(held) = text.held_latents() {
            noise = hold_frames(&noise, held);
        }
        let s = per_row(&sigma, x0);
        let noised = (1.0 - &s) * x0.detach().to_kind(Kind::Float) + &s * &noise;
        (sigma, noise, noised)
    }
}

/// `sigma` for each of `rows` rows, f32 on `device`.
fn sigma_rows(sigma: f32, rows: usize, device: Device) -> Tensor {
    upload(Tensor::from_slice(&vec![sigma; rows]), device)
}
