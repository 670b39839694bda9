//! A small random `AutoencoderKLQwenImage` checkpoint in the diffusers layout, for tests.

use std::path::Path;

use flowtune_sampling::SampleRng;
use serde_json::json;
use tch::{Device, Tensor};

use super::{AutoencoderKlQwenImage, QwenVaeConfig};
use crate::{write_json, ModelError};

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
    let vae = AutoencoderKlQwenImage::new(config, Device::Cpu)?;
    let mut rng = SampleRng::new(seed);
    let mut vars: Vec<(String, Tensor)> = vae.store.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    tch::no_grad(|| -> Result<(), ModelError> {
        for (name, var) in &vars {
            let size = var.size();
            let noise = rng.normal(&size, Device::Cpu);
            let value = if name.ends_with(".gamma") {
                noise * 0.1 + 1.0
            } else if name.ends_with(".bias") {
                noise * 0.1
            } else {
                let fan_in: i64 = size[1..].iter().product();
                noise / (fan_in as f64).sqrt()
            };
            var.shallow_clone().f_copy_(&value)?;
        }
        Ok(())
    })?;
    std::fs::create_dir_all(dir)
        .map_err(|e| ModelError::Io { path: dir.display().to_string(), message: e.to_string() })?;
    Tensor::write_safetensors(&vars, dir.join("diffusion_pytorch_model.safetensors"))?;
    let mut cfg = serde_json::to_value(config).expect("serialisable config");
    cfg["_class_name"] = json!("AutoencoderKLQwenImage");
    cfg["_diffusers_version"] = json!("0.42.1");
    write_json(&dir.join("config.json"), &cfg)
}
