//! Flow-matching sampling math shared by the rollout and the trainer: sigma grids
//! ([`schedule`]), stochastic reverse steps with log-probs ([`step`]), per-sample seeds and noise
//! ([`noise`]) and SDE windows ([`window`]). Pure functions of tensors and numbers; no I/O beyond
//! reading a scheduler config.

pub mod config;
pub mod noise;
pub mod schedule;
pub mod step;
pub mod window;

pub use config::{SamplerConfig, WindowStrategy};
pub use noise::{row_seed, upload, SampleNoise, SampleRng};
pub use schedule::{DeviceGrid, GridRequest, Pipeline, SchedulerConfig, SigmaGrid, TimeShiftType};
pub use step::{
    euler_step, per_row, reverse_step, reverse_step_over, Draw, SdeType, StepOutput, StepParams,
};

/// Errors of the sampling math: bad settings, off-grid timesteps, unreadable scheduler configs.
#[derive(Debug, thiserror::Error)]
pub enum SamplingError {
    #[error("{0}")]
    Invalid(String),
    #[error("{key}: {value} is not allowed; expected {expected}")]
    Setting { key: &'static str, value: String, expected: String },
    #[error("unknown {what} `{value}`; expected one of: {choices}")]
    UnknownChoice { what: &'static str, value: String, choices: String },
    #[error("timestep {timestep:?} is not on the sampling grid {grid}{nearest}")]
    TimestepNotOnGrid { timestep: f32, grid: String, nearest: String },
    #[error("{path}: {message}")]
    Config { path: String, message: String },
    #[error("cannot read {path}: {message}")]
    Io { path: String, message: String },
}

impl SamplingError {
    fn setting(
        key: &'static str,
        value: impl std::fmt::Display,
        expected: impl Into<String>,
    ) -> Self {
        Self::Setting { key, value: value.to_string(), expected: expected.into() }
    }
}
