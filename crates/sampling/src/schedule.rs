//! Sigma grids of diffusers' `FlowMatchEulerDiscreteScheduler` (`set_timesteps`), reproduced to the
//! float: the grid a rollout samples on and the grid the trainer replays must be the same numbers.
//!
//! diffusers mixes precisions: the 1000-step training grid is built in f32 (torch), the inference
//! grid from `np.linspace` in f64, and explicit pipeline sigmas (Flux, Qwen-Image) in f32 numpy with
//! NEP 50 scalar rules. [`Arith`] replays each operation in the precision diffusers uses.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::SamplingError;

/// Mirror of a diffusers `scheduler/scheduler_config.json` for `FlowMatchEulerDiscreteScheduler`,
/// or for `UniPCMultistepScheduler` with flow sigmas (Wan), whose grid flowtune samples with its
/// own SDE / ODE steps. Fields diffusers adds that do not change the grid are accepted and ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SchedulerConfig {
    #[serde(rename = "_class_name")]
    pub class_name: Option<String>,
    pub num_train_timesteps: u32,
    pub shift: f64,
    pub use_dynamic_shifting: bool,
    pub base_shift: f64,
    pub max_shift: f64,
    pub base_image_seq_len: u64,
    pub max_image_seq_len: u64,
    pub invert_sigmas: bool,
    pub shift_terminal: Option<f64>,
    pub use_karras_sigmas: bool,
    pub use_exponential_sigmas: bool,
    pub use_beta_sigmas: bool,
    pub time_shift_type: TimeShiftType,
    pub stochastic_sampling: bool,
    /// UniPC: whether the grid is the flow-matching one (required; Wan's configs set it).
    pub use_flow_sigmas: bool,
    /// UniPC: the static shift of the flow sigmas (FlowMatchEuler's `shift`).
    pub flow_shift: Option<f64>,
    /// UniPC: what the model predicts (`flow_prediction` required).
    pub prediction_type: Option<String>,
    /// UniPC: the sigma appended after the last step (`zero` required).
    pub final_sigmas_type: Option<String>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            class_name: None,
            num_train_timesteps: 1000,
            shift: 1.0,
            use_dynamic_shifting: false,
            base_shift: 0.5,
            max_shift: 1.15,
            base_image_seq_len: 256,
            max_image_seq_len: 4096,
            invert_sigmas: false,
            shift_terminal: None,
            use_karras_sigmas: false,
            use_exponential_sigmas: false,
            use_beta_sigmas: false,
            time_shift_type: TimeShiftType::Exponential,
            stochastic_sampling: false,
            use_flow_sigmas: false,
            flow_shift: None,
            prediction_type: None,
            final_sigmas_type: None,
        }
    }
}

/// How the dynamic shift maps σ given μ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeShiftType {
    /// `σ ← e^μ / (e^μ + (1/σ − 1))`
    Exponential,
    /// `σ ← μ / (μ + (1/σ − 1))`
    Linear,
}

/// Which diffusers pipeline's `set_timesteps` call to reproduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Pipeline {
    /// Stable Diffusion 3 / 3.5: the scheduler's own `linspace` grid.
    #[default]
    Sd3,
    /// Flux: explicit sigmas `linspace(1, 1/N, N)`, μ from the image token count.
    Flux,
    /// Qwen-Image: as Flux.
    QwenImage,
    /// Z-Image: explicit sigmas from `torch.linspace(1, 1/N, N)` (f32), then the config's shift.
    ZImage,
    /// FLUX.2: as Flux, with the empirical μ of the image token count and the step count.
    Flux2,
    /// Wan: UniPC's flow sigmas, `linspace(1, 1/T, N+1)[:-1]` shifted by `flow_shift` in f64,
    /// σ₀ lowered by 1e-6 when it is 1; timesteps are `σ·T` truncated to integers, as WanPipeline
    /// feeds its transformer.
    Wan,
}

impl Pipeline {
    /// Every pipeline name, for error messages and `--help`.
    pub const NAMES: [&'static str; 6] = ["sd3", "flux", "qwen_image", "z_image", "flux2", "wan"];

    /// Parses a pipeline name as written in recipes and on the command line.
    pub fn parse(name: &str) -> Result<Self, SamplingError> {
        match name {
            "sd3" => Ok(Self::Sd3),
            "flux" => Ok(Self::Flux),
            "qwen_image" => Ok(Self::QwenImage),
            "z_image" => Ok(Self::ZImage),
            "flux2" => Ok(Self::Flux2),
            "wan" => Ok(Self::Wan),
            _ => Err(SamplingError::UnknownChoice {
                what: "pipeline",
                value: name.to_string(),
                choices: Self::NAMES.join(", "),
            }),
        }
    }

    fn uses_explicit_sigmas(self) -> bool {
        !matches!(self, Self::Sd3)
    }
}

impl SchedulerConfig {
    /// Reads a diffusers `scheduler_config.json`, rejecting options this grid does not implement.
    pub fn from_file(path: &Path) -> Result<Self, SamplingError> {
        let text = std::fs::read_to_string(path).map_err(|e| SamplingError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let config: Self = serde_json::from_str(&text).map_err(|e| SamplingError::Config {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        config.check().map_err(|message| SamplingError::Config {
            path: path.display().to_string(),
            message,
        })?;
        Ok(config)
    }

    fn check(&self) -> Result<(), String> {
        match self.class_name.as_deref() {
            None | Some("FlowMatchEulerDiscreteScheduler") => {}
            Some("UniPCMultistepScheduler") => self.check_unipc()?,
            Some(name) => {
                return Err(format!(
                "_class_name `{name}` is not supported; expected FlowMatchEulerDiscreteScheduler \
                     or UniPCMultistepScheduler with use_flow_sigmas"
            ))
            }
        }
        let unsupported = [
            ("use_karras_sigmas", self.use_karras_sigmas),
            ("use_exponential_sigmas", self.use_exponential_sigmas),
            ("use_beta_sigmas", self.use_beta_sigmas),
            ("invert_sigmas", self.invert_sigmas),
            ("stochastic_sampling", self.stochastic_sampling),
        ];
        if let Some((key, _)) = unsupported.iter().find(|(_, on)| *on) {
            return Err(format!(
                "`{key}: true` is not supported (flow-matching RL needs the plain Euler grid)"
            ));
        }
        if self.num_train_timesteps < 2 {
            return Err(format!(
                "num_train_timesteps must be ≥ 2, got {}",
                self.num_train_timesteps
            ));
        }
        let shift_key = if self.flow_shift.is_some() { "flow_shift" } else { "shift" };
        let shift = self.static_shift();
        if !(shift.is_finite() && shift > 0.0) {
            return Err(format!("{shift_key} must be > 0, got {shift}"));
        }
        if self.use_dynamic_shifting && self.max_image_seq_len == self.base_image_seq_len {
            return Err(format!(
                "max_image_seq_len and base_image_seq_len are both {}; dynamic shifting needs two different lengths",
                self.max_image_seq_len
            ));
        }
        if let Some(t) = self.shift_terminal {
            if !(0.0..1.0).contains(&t) {
                return Err(format!("shift_terminal must be in [0, 1), got {t}"));
            }
        }
        Ok(())
    }

    /// The settings of a UniPC config that keep its grid the flow-matching one flowtune steps on.
    fn check_unipc(&self) -> Result<(), String> {
        const WHY: &str = "UniPCMultistepScheduler is read for its flow-matching grid only";
        if !self.use_flow_sigmas {
            return Err(format!("`use_flow_sigmas` must be true ({WHY})"));
        }
        if self.flow_shift.is_none() {
            return Err(format!("`flow_shift` is required ({WHY})"));
        }
        let strings = [
            ("prediction_type", &self.prediction_type, "flow_prediction"),
            ("final_sigmas_type", &self.final_sigmas_type, "zero"),
        ];
        for (key, value, want) in strings {
            if let Some(v) = value.as_deref().filter(|v| *v != want) {
                return Err(format!("`{key}: {v}` is not supported; expected `{want}` ({WHY})"));
            }
        }
        let off = [
            ("use_dynamic_shifting", self.use_dynamic_shifting),
            ("shift_terminal", self.shift_terminal.is_some_and(|t| t > 0.0)),
        ];
        if let Some((key, _)) = off.iter().find(|(_, on)| *on) {
            return Err(format!("`{key}` is not supported ({WHY}, with a static flow_shift)"));
        }
        Ok(())
    }

    /// The static shift of the grid: UniPC's `flow_shift`, else FlowMatchEuler's `shift`.
    pub fn static_shift(&self) -> f64 {
        self.flow_shift.unwrap_or(self.shift)
    }

    /// `μ = m·seq_len + b` of diffusers' `calculate_shift`, from this config's shift bounds.
    pub fn mu_for(&self, image_seq_len: u64) -> f64 {
        let m = (self.max_shift - self.base_shift)
            / (self.max_image_seq_len as f64 - self.base_image_seq_len as f64);
        let b = self.base_shift - m * self.base_image_seq_len as f64;
        image_seq_len as f64 * m + b
    }
}

/// A sampling grid: N timesteps and N+1 sigmas (the last one 0).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SigmaGrid {
    pub sigmas: Vec<f32>,
    pub timesteps: Vec<f32>,
    /// The dynamic-shift μ, when the grid used one.
    pub mu: Option<f64>,
}

/// What to build a grid from besides the scheduler config.
#[derive(Debug, Clone, Default)]
pub struct GridRequest {
    pub steps: usize,
    pub pipeline: Pipeline,
    /// Packed image tokens, needed for dynamic shifting.
    pub image_seq_len: Option<u64>,
    /// Explicit sigmas that replace the pipeline's own (N = their count).
    pub sigmas: Option<Vec<f64>>,
}

/// Float arithmetic in the precision diffusers uses for one part of the computation.
#[derive(Clone, Copy)]
enum Arith {
    F32,
    F64,
}

impl Arith {
    fn r(self, x: f64) -> f64 {
        match self {
            Arith::F32 => x as f32 as f64,
            Arith::F64 => x,
        }
    }
    fn add(self, a: f64, b: f64) -> f64 {
        self.r(self.r(a) + self.r(b))
    }
    fn sub(self, a: f64, b: f64) -> f64 {
        self.r(self.r(a) - self.r(b))
    }
    fn mul(self, a: f64, b: f64) -> f64 {
        self.r(self.r(a) * self.r(b))
    }
    fn div(self, a: f64, b: f64) -> f64 {
        self.r(self.r(a) / self.r(b))
    }
    /// Static shift `s·σ / (1 + (s−1)·σ)`.
    fn static_shift(self, s: f64, sigma: f64) -> f64 {
        self.div(self.mul(s, sigma), self.add(1.0, self.mul(s - 1.0, sigma)))
    }
}

/// FLUX.2's `compute_empirical_mu`: μ fitted to the image token count and the step count (f64).
fn empirical_mu(image_seq_len: u64, steps: usize) -> f64 {
    let (a1, b1) = (8.73809524e-05, 1.89833333);
    let (a2, b2) = (0.00016927, 0.45666666);
    let seq = image_seq_len as f64;
    if image_seq_len > 4300 {
        return a2 * seq + b2;
    }
    let (m_200, m_10) = (a2 * seq + b2, a1 * seq + b1);
    let a = (m_200 - m_10) / 190.0;
    let b = m_200 - 200.0 * a;
    a * steps as f64 + b
}

/// numpy's `linspace(start, stop, num)` in f64, bit for bit.
fn linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    if num == 1 {
        return vec![start];
    }
    let step = (stop - start) / (num - 1) as f64;
    let mut out: Vec<f64> = (0..num).map(|i| i as f64 * step + start).collect();
    out[num - 1] = stop;
    out
}

/// `torch.linspace(1, 1/N, N)` in f32 on the CPU (libtorch's own kernel, whose halves count from
/// both ends), as Z-Image's `get_default_z_image_sigmas` builds them.
fn torch_linspace(num: usize) -> Result<Vec<f64>, SamplingError> {
    let stop = 1.0 / num as f64;
    let t = tch::Tensor::f_linspace(1.0, stop, num as i64, (tch::Kind::Float, tch::Device::Cpu))
        .and_then(Vec::<f32>::try_from)
        .map_err(|e| SamplingError::Invalid(format!("torch.linspace(1, 1/{num}, {num}): {e}")))?;
    Ok(t.into_iter().map(f64::from).collect())
}

impl SigmaGrid {
    /// `FlowMatchEulerDiscreteScheduler.set_timesteps` as the chosen pipeline calls it.
    pub fn new(config: &SchedulerConfig, request: &GridRequest) -> Result<Self, SamplingError> {
        config.check().map_err(|message| SamplingError::Config {
            path: "scheduler config".into(),
            message,
        })?;
        if request.pipeline == Pipeline::Wan {
            return Self::flow_sigmas(config, request);
        }
        let explicit = match &request.sigmas {
            Some(s) => Some(s.clone()),
            None if request.pipeline == Pipeline::ZImage => Some(torch_linspace(request.steps)?),
            None if request.pipeline.uses_explicit_sigmas() => {
                let n = request.steps as f64;
                Some(linspace(1.0, 1.0 / n, request.steps))
            }
            None => None,
        };
        let steps = explicit.as_ref().map_or(request.steps, Vec::len);
        if steps == 0 {
            return Err(SamplingError::Invalid("the number of sampling steps must be ≥ 1".into()));
        }
        if let Some(s) = &explicit {
            if s.iter().any(|x| !(*x > 0.0 && *x <= 1.0)) || s.windows(2).any(|w| w[1] >= w[0]) {
                return Err(SamplingError::Invalid(format!(
                    "explicit sigmas must decrease strictly within (0, 1], got {s:?}"
                )));
            }
        }
        let mu = if config.use_dynamic_shifting {
            let seq = request.image_seq_len.ok_or_else(|| {
                SamplingError::Invalid(
                    "use_dynamic_shifting is on: the image token count (image_seq_len) is required"
                        .into(),
                )
            })?;
            Some(match request.pipeline {
                Pipeline::Flux2 => empirical_mu(seq, steps),
                _ => config.mu_for(seq),
            })
        } else {
            None
        };
        let (sigmas, arith) = match explicit {
            // `np.array(sigmas).astype(np.float32)`: everything after runs in f32.
            Some(s) => (s.into_iter().map(|x| x as f32 as f64).collect::<Vec<_>>(), Arith::F32),
            None => {
                let (sigma_max, sigma_min) = training_grid_bounds(config);
                let n = config.num_train_timesteps as f64;
                let t = linspace(sigma_max * n, sigma_min * n, steps);
                (t.into_iter().map(|t| t / n).collect(), Arith::F64)
            }
        };
        let shifted: Vec<f64> = match mu {
            Some(mu) => {
                sigmas.iter().map(|&s| time_shift(arith, config.time_shift_type, mu, s)).collect()
            }
            None => sigmas.iter().map(|&s| arith.static_shift(config.static_shift(), s)).collect(),
        };
        let stretched = match config.shift_terminal {
            Some(terminal) if terminal > 0.0 => stretch_to_terminal(arith, &shifted, terminal),
            _ => shifted,
        };
        let mut sigmas: Vec<f32> = stretched.iter().map(|&s| s as f32).collect();
        if sigmas.iter().any(|s| !s.is_finite()) {
            return Err(SamplingError::Invalid(format!(
                "this scheduler config gives a non-finite sigma grid {sigmas:?} for {steps} steps"
            )));
        }
        let scale = config.num_train_timesteps as f32;
        let timesteps = sigmas.iter().map(|&s| s * scale).collect();
        sigmas.push(0.0);
        Ok(Self { sigmas, timesteps, mu })
    }

    /// UniPC's `set_timesteps` with `use_flow_sigmas` and a static `flow_shift`, in f64 as numpy
    /// computes it; the timesteps are truncated to integers as WanPipeline passes them on.
    fn flow_sigmas(config: &SchedulerConfig, request: &GridRequest) -> Result<Self, SamplingError> {
        let n = config.num_train_timesteps as f64;
        let base = match &request.sigmas {
            Some(s) => s.clone(),
            None => {
                let mut s = linspace(1.0, 1.0 / n, request.steps + 1);
                s.pop();
                s
            }
        };
        if base.is_empty() {
            return Err(SamplingError::Invalid("the number of sampling steps must be ≥ 1".into()));
        }
        let mut sigmas: Vec<f64> =
            base.iter().map(|&s| Arith::F64.static_shift(config.static_shift(), s)).collect();
        if (sigmas[0] - 1.0).abs() < 1e-6 {
            sigmas[0] -= 1e-6;
        }
        let timesteps: Vec<f32> = sigmas.iter().map(|&s| (s * n).trunc() as f32).collect();
        if let Some(w) = timesteps.windows(2).find(|w| w[1] >= w[0]) {
            return Err(SamplingError::Invalid(format!(
                "{} steps give the integer timestep {} twice (or out of order) on this flow_shift \
                 grid; use fewer steps",
                sigmas.len(),
                w[1]
            )));
        }
        let mut sigmas: Vec<f32> = sigmas.into_iter().map(|s| s as f32).collect();
        sigmas.push(0.0);
        Ok(Self { sigmas, timesteps, mu: None })
    }

    /// Number of denoising steps N.
    pub fn steps(&self) -> usize {
        self.timesteps.len()
    }

    /// Index of a stored timestep on this grid, by exact equality.
    pub fn index_of(&self, timestep: f32) -> Result<usize, SamplingError> {
        self.timesteps.iter().position(|&t| t == timestep).ok_or_else(|| {
            let nearest = self
                .timesteps
                .iter()
                .enumerate()
                .min_by(|a, b| (a.1 - timestep).abs().total_cmp(&(b.1 - timestep).abs()));
            SamplingError::TimestepNotOnGrid {
                timestep,
                grid: format!("{:?}", self.timesteps),
                nearest: nearest
                    .map_or_else(String::new, |(i, t)| format!("; nearest is {t:?} (step {i})")),
            }
        })
    }

    /// `(σ_i, σ_{i+1})` of the step that starts at `timestep`.
    pub fn step_sigmas(&self, timestep: f32) -> Result<(f32, f32), SamplingError> {
        let i = self.index_of(timestep)?;
        Ok((self.sigmas[i], self.sigmas[i + 1]))
    }
}

/// A grid's timesteps and sigmas as tensors on the device, to look up the steps of recorded
/// timesteps there without reading them back to the host (no synchronisation in replays).
#[derive(Debug)]
pub struct DeviceGrid {
    timesteps: Tensor,
    sigmas: Tensor,
}

impl DeviceGrid {
    pub fn new(grid: &SigmaGrid, device: Device) -> Self {
        Self {
            timesteps: Tensor::from_slice(&grid.timesteps).to_device(device),
            sigmas: Tensor::from_slice(&grid.sigmas).to_device(device),
        }
    }

    /// `(σ_i, σ_{i+1})` per row (f32, on the device) of `timesteps` (B,): timesteps recorded from
    /// this grid, each matched to the grid entry it equals (the nearest one).
    pub fn step_sigmas(&self, timesteps: &Tensor) -> (Tensor, Tensor) {
        let t = timesteps.to_kind(Kind::Float).reshape([-1, 1]);
        let index = (t - self.timesteps.unsqueeze(0)).abs().argmin(1, false);
        (self.sigmas.index_select(0, &index), self.sigmas.index_select(0, &(index + 1)))
    }
}

impl SchedulerConfig {
    /// σ at `index` of the 1000-step training grid (index 0 is the noisiest), as diffusers'
    /// training scripts pick `sigmas[indices]`; carries the static shift unless dynamic shifting is on.
    pub fn training_sigma(&self, index: usize) -> f64 {
        let n = self.num_train_timesteps as usize;
        let s = (n - index.min(n - 1)) as f64 / n as f64;
        if self.use_dynamic_shifting {
            s
        } else {
            Arith::F32.static_shift(self.static_shift(), s)
        }
    }

    /// σ from a uniform `u ∈ [0, 1)` (e.g. a logit-normal draw): the grid entry at `⌊u·N⌋`.
    pub fn training_sigma_at(&self, u: f64) -> f64 {
        let n = self.num_train_timesteps as usize;
        self.training_sigma(((u * n as f64) as usize).min(n - 1))
    }
}

/// First and last σ of the 1000-step training grid built in `__init__` (f32 torch), which already
/// carries the static shift unless dynamic shifting is on.
fn training_grid_bounds(config: &SchedulerConfig) -> (f64, f64) {
    (config.training_sigma(0), config.training_sigma(config.num_train_timesteps as usize - 1))
}

fn time_shift(a: Arith, kind: TimeShiftType, mu: f64, sigma: f64) -> f64 {
    let odds = a.sub(a.div(1.0, sigma), 1.0);
    let m = match kind {
        TimeShiftType::Exponential => mu.exp(),
        TimeShiftType::Linear => mu,
    };
    a.div(m, a.add(m, odds))
}

/// diffusers' `stretch_shift_to_terminal`: `z = 1 − σ; σ ← 1 − z / (z_last / (1 − terminal))`.
fn stretch_to_terminal(a: Arith, sigmas: &[f64], terminal: f64) -> Vec<f64> {
    let one_minus: Vec<f64> = sigmas.iter().map(|&s| a.sub(1.0, s)).collect();
    let last = *one_minus.last().expect("grid has at least one sigma");
    let scale = a.div(last, 1.0 - terminal);
    one_minus.iter().map(|&z| a.sub(1.0, a.div(z, scale))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sd35() -> SchedulerConfig {
        SchedulerConfig { shift: 3.0, ..Default::default() }
    }

    fn sd35_grid(steps: usize) -> SigmaGrid {
        SigmaGrid::new(&sd35(), &GridRequest { steps, ..Default::default() }).unwrap()
    }

    #[test]
    fn static_shift_reaches_sigma_min_twice() {
        let g = sd35_grid(10);
        assert_eq!(g.sigmas.len(), 11);
        assert_eq!(g.sigmas[0], 1.0);
        assert_eq!(*g.sigmas.last().unwrap(), 0.0);
        assert!((g.sigmas[9] - 0.008_928_57).abs() < 1e-7, "{}", g.sigmas[9]);
    }

    #[test]
    fn lookup_is_exact_and_errors_off_grid() {
        let g = sd35_grid(10);
        let t = g.timesteps[4];
        assert_eq!(g.index_of(t).unwrap(), 4);
        assert_eq!(g.step_sigmas(t).unwrap(), (g.sigmas[4], g.sigmas[5]));
        let off = f32::from_bits(t.to_bits() + 1);
        let err = g.index_of(off).unwrap_err().to_string();
        assert!(err.contains("not on the sampling grid"), "{err}");
    }

    #[test]
    fn device_lookup_matches_the_exact_one_on_every_step() {
        let g = sd35_grid(10);
        let order = [7usize, 0, 9, 4, 4];
        let t: Vec<f32> = order.iter().map(|&i| g.timesteps[i]).collect();
        let (sigma, next) = DeviceGrid::new(&g, Device::Cpu).step_sigmas(&Tensor::from_slice(&t));
        let (sigma, next) =
            (Vec::<f32>::try_from(sigma).unwrap(), Vec::<f32>::try_from(next).unwrap());
        for (k, &ts) in t.iter().enumerate() {
            assert_eq!((sigma[k], next[k]), g.step_sigmas(ts).unwrap(), "row {k}");
        }
    }

    #[test]
    fn dynamic_shift_requires_seq_len() {
        let cfg = SchedulerConfig { use_dynamic_shifting: true, ..Default::default() };
        let req = GridRequest { steps: 4, pipeline: Pipeline::Flux, ..Default::default() };
        let err = SigmaGrid::new(&cfg, &req).unwrap_err().to_string();
        assert!(err.contains("image_seq_len"), "{err}");
    }

    #[test]
    fn linear_time_shift_and_explicit_sigmas() {
        let cfg = SchedulerConfig {
            use_dynamic_shifting: true,
            time_shift_type: TimeShiftType::Linear,
            base_shift: 2.0,
            max_shift: 2.0,
            ..Default::default()
        };
        let req = GridRequest {
            steps: 0,
            image_seq_len: Some(1024),
            sigmas: Some(vec![1.0, 0.5, 0.2]),
            ..Default::default()
        };
        let g = SigmaGrid::new(&cfg, &req).unwrap();
        // μ = 2: σ ← 2 / (2 + 1/σ − 1).
        assert_eq!(g.mu, Some(2.0));
        let want = [1.0, 2.0 / 3.0, 2.0 / 6.0, 0.0];
        for (got, want) in g.sigmas.iter().zip(want) {
            assert!((*got as f64 - want).abs() < 1e-6, "{:?}", g.sigmas);
        }
        assert_eq!(g.steps(), 3);
    }

    fn unipc(extra: serde_json::Value) -> Result<SchedulerConfig, String> {
        let mut v = serde_json::json!({
            "_class_name": "UniPCMultistepScheduler", "use_flow_sigmas": true, "flow_shift": 5.0,
            "prediction_type": "flow_prediction", "final_sigmas_type": "zero", "solver_order": 2
        });
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let config: SchedulerConfig = serde_json::from_value(v).unwrap();
        config.check().map(|_| config)
    }

    #[test]
    fn unipc_configs_are_read_for_their_flow_grid_only() {
        let config = unipc(serde_json::json!({})).unwrap();
        assert_eq!(config.static_shift(), 5.0);
        let refused = [
            (serde_json::json!({"use_flow_sigmas": false}), "`use_flow_sigmas` must be true"),
            (serde_json::json!({"prediction_type": "epsilon"}), "`prediction_type: epsilon`"),
            (
                serde_json::json!({"final_sigmas_type": "sigma_min"}),
                "`final_sigmas_type: sigma_min`",
            ),
            (serde_json::json!({"use_dynamic_shifting": true}), "`use_dynamic_shifting`"),
            (serde_json::json!({"use_karras_sigmas": true}), "`use_karras_sigmas: true`"),
            (serde_json::json!({"flow_shift": 0.0}), "flow_shift must be > 0"),
        ];
        for (extra, want) in refused {
            let err = unipc(extra).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
        let mut no_shift = unipc(serde_json::json!({})).unwrap();
        no_shift.flow_shift = None;
        assert!(no_shift.check().unwrap_err().contains("`flow_shift` is required"));
    }

    #[test]
    fn wan_grid_refuses_repeated_integer_timesteps() {
        let config = unipc(serde_json::json!({})).unwrap();
        let req = GridRequest { steps: 400, pipeline: Pipeline::Wan, ..Default::default() };
        let err = SigmaGrid::new(&config, &req).unwrap_err().to_string();
        assert!(err.contains("400 steps give the integer timestep"), "{err}");
        let req = GridRequest { steps: 4, pipeline: Pipeline::Wan, ..Default::default() };
        let g = SigmaGrid::new(&config, &req).unwrap();
        assert_eq!(g.timesteps, [999.0, 937.0, 833.0, 625.0]);
        assert_eq!(g.sigmas[0], (1.0f64 - 1e-6) as f32);
    }
}
