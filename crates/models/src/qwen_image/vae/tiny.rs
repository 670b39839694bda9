//! A small random `AutoencoderKLQwenImage` checkpoint in the diffusers layout, for tests.

use std::path::Path;

use tch::{Device, Kind};

use super::{AutoencoderKlQwenImage, QwenVaeConfig};
use crate::causal_vae::write_random_vae;
use crate::ModelError;

impl QwenVaeConfig {
    /// The real layout (four levels, z_dim 16, temporal downsampling in the last two) at width 4.
    pub fn tiny() -> Self {
        Self { base_dim: 4, dim_mult: vec![1, 2, 2, 2], num_res_blocks: 1, ..Default::default() }
    }
}

/// Writes `config.json` and `diffusion_pytorch_model.safetensors` of a random VAE into `dir`
/// (created if missing): weights N(0, 1/fan-in), biases N(0, 0.1²), norm scales 1 + N(0, 0.1²),
/// drawn from `seed` the same way on every machine.
pub fn write_tiny_qwen_vae(
    dir: &Path,
    seed: u64,
    config: &QwenVaeConfig,
) -> Result<(), ModelError> {
    let vae = AutoencoderKlQwenImage::new(config, Device::Cpu, Kind::Float)?;
    write_random_vae(dir, &vae.store, seed, config, "AutoencoderKLQwenImage")
}
