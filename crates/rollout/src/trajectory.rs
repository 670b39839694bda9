//! One batched trajectory: CFG velocities, SDE steps inside each row's window, Euler outside,
//! recording the window's latents, log-probs and timesteps.

use std::ops::Range;

use flowtune_models::{
    generated_frames, guided_velocity, hold_frames, CfgScale, Denoiser, TextConditioning,
};
use flowtune_sampling::{
    euler_step, per_row, reverse_step_over, upload, Draw, SigmaGrid, StepParams,
};
use tch::{Kind, Tensor};

use crate::RolloutError;

/// Classifier-free guidance where the denoiser's family runs it at `scale`
/// ([`Denoiser::runs_cfg`]), combined as the family does ([`flowtune_models::guided_velocity`]);
/// `scale_2` at a two-expert denoiser's low-noise steps.
pub struct Guidance<'a> {
    pub scale: f64,
    pub scale_2: Option<f64>,
    pub negative: Option<&'a TextConditioning>,
}

/// Everything one trajectory needs besides the model.
pub struct TrajectoryRequest<'a> {
    pub grid: &'a SigmaGrid,
    pub text: &'a TextConditioning,
    pub guidance: Guidance<'a>,
    /// Step settings inside the window (noise level, SDE type, normaliser).
    pub step: StepParams,
    /// Per row: the stochastic steps (all rows the same length W).
    pub windows: &'a [Range<usize>],
    /// Initial latents (B, …): (B, C, H, W) for images, (B, C, F, H, W) for video.
    pub initial: &'a Tensor,
}

/// A recorded trajectory.
#[derive(Debug)]
pub struct Trajectory {
    /// (B, W+1, …): the latent entering the first window step, then after each window step.
    pub all_latents: Tensor,
    /// (B, W) log-probs of the window steps.
    pub all_log_probs: Tensor,
    /// (B, W) timesteps of the window steps.
    pub all_timesteps: Tensor,
    /// (B, …) clean latents at the end.
    pub final_latents: Tensor,
}

/// Samples a trajectory; `step_noise(i)` gives the (B, …) Gaussian of step i, drawn for every step
/// as the seeds contract requires. Latents the text holds fixed (image-to-video's first frame,
/// [`TextConditioning::held_latents`]) keep their values in every recorded and final latent, and
/// the log-probs average over the generated frames only.
pub fn sample_trajectory<D: Denoiser + ?Sized>(
    model: &D,
    request: &TrajectoryRequest<'_>,
    mut step_noise: impl FnMut(usize) -> Tensor,
) -> Result<Trajectory, RolloutError> {
    let grid = request.grid;
    let b = request.initial.size()[0];
    let w = request.windows.first().map_or(0, Range::len);
    if request.windows.len() as i64 != b
        || request.windows.iter().any(|r| r.len() != w || r.end > grid.steps())
    {
        return Err(RolloutError::Input(format!(
            "{} windows for {b} rows; each must have the same length and end by step {}",
            request.windows.len(),
            grid.steps()
        )));
    }
    let device = request.initial.device();
    let scale = request.guidance.scale;
    let negative = match (model.runs_cfg(scale), request.guidance.negative) {
        (true, None) => {
            return Err(RolloutError::Input(format!(
                "CFG runs at guidance_scale {scale} for this family and needs negative text \
                 conditioning"
            )))
        }
        (true, negative) => negative,
        (false, _) => None,
    };
    let held = request.text.held_latents();
    let hold = |x: Tensor| match held {
        Some(h) => hold_frames(&x, h),
        None => x,
    };
    let mut x = hold(request.initial.to_kind(Kind::Float));
    let generated = held.map(|h| generated_frames(&x, h));
    let mut latents: Vec<Vec<Tensor>> = (0..b).map(|_| vec![]).collect();
    let mut log_probs: Vec<Vec<Tensor>> = (0..b).map(|_| vec![]).collect();
    let mut timesteps: Vec<Vec<f32>> = vec![vec![]; b as usize];
    for i in 0..grid.steps() {
        let t = Tensor::full([b], grid.timesteps[i] as f64, (Kind::Float, device));
        let scale = CfgScale { scale: request.guidance.scale, scale_2: request.guidance.scale_2 };
        let v = guided_velocity(model, &x, &t, request.text, negative, scale)?;
        let z = step_noise(i);
        let sigma = Tensor::full([b], grid.sigmas[i] as f64, (Kind::Float, device));
        let sigma_next = Tensor::full([b], grid.sigmas[i + 1] as f64, (Kind::Float, device));
        let in_window: Vec<bool> = request.windows.iter().map(|r| r.contains(&i)).collect();
        let next = if in_window.iter().any(|&s| s) {
            let mut out = reverse_step_over(
                &request.step,
                &v,
                &x,
                &sigma,
                &sigma_next,
                Draw::Noise(&z),
                generated.as_ref(),
            )?;
            out.prev_sample = hold(out.prev_sample);
            let euler = euler_step(&x, &v, &sigma, &sigma_next);
            for (row, &stochastic) in in_window.iter().enumerate() {
                if stochastic {
                    let r = row as i64;
                    if request.windows[row].start == i {
                        latents[row].push(x.get(r));
                    }
                    latents[row].push(out.prev_sample.get(r));
                    log_probs[row].push(out.log_prob.get(r));
                    timesteps[row].push(grid.timesteps[i]);
                }
            }
            let mask = per_row(&upload(Tensor::from_slice(&in_window), device), &x);
            out.prev_sample.where_self(&mask, &euler)
        } else {
            euler_step(&x, &v, &sigma, &sigma_next)
        };
        x = hold(next);
    }
    let stack_rows = |rows: Vec<Vec<Tensor>>| {
        Tensor::stack(&rows.into_iter().map(|r| Tensor::stack(&r, 0)).collect::<Vec<_>>(), 0)
    };
    let all_timesteps: Vec<f32> = timesteps.concat();
    Ok(Trajectory {
        all_latents: if w > 0 {
            stack_rows(latents)
        } else {
            Tensor::empty([b, 0], (Kind::Float, device))
        },
        all_log_probs: if w > 0 {
            stack_rows(log_probs)
        } else {
            Tensor::empty([b, 0], (Kind::Float, device))
        },
        all_timesteps: Tensor::from_slice(&all_timesteps).view([b, w as i64]).to_device(device),
        final_latents: x,
    })
}
