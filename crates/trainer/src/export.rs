//! What a run leaves for use outside flowtune: the trained weights (the LoRA in the
//! diffusers/PEFT layout, or a diffusers `transformer/` folder) and `export_manifest.json` beside
//! them — which files, their SHA-256, the base model they apply to (with the SHA-256 of its
//! transformer's `config.json`) and how the trained model samples.

use std::io::Read;
use std::path::{Path, PathBuf};

use flowtune_config::Recipe;
use flowtune_models::FlowPipeline;
use flowtune_sampling::SigmaGrid;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::TrainError;

/// The manifest's name, beside the exported weights.
pub const MANIFEST: &str = "export_manifest.json";

/// Writes the trained weights for use outside flowtune: the LoRA in the diffusers/PEFT layout
/// (`lora/pytorch_lora_weights.safetensors`), or after full fine-tuning a diffusers
/// `transformer/` folder to put in place of the pipeline's. `ema` names the EMA variant. Only the
/// writing rank (`write`) writes; every rank calls it (sharded blocks are gathered) and returns
/// the path.
pub(crate) fn export_weights(
    pipe: &dyn FlowPipeline,
    out_dir: &Path,
    ema: bool,
    write: bool,
) -> Result<PathBuf, TrainError> {
    let model = pipe.denoiser();
    let lora = model.adapters().is_some();
    let (dir, file) = match (lora, ema) {
        (true, false) => (out_dir.join("lora"), "pytorch_lora_weights.safetensors"),
        (true, true) => (out_dir.join("lora"), "ema_lora_weights.safetensors"),
        (false, false) => (out_dir.join("transformer"), "diffusion_pytorch_model.safetensors"),
        (false, true) => (out_dir.join("ema_transformer"), "diffusion_pytorch_model.safetensors"),
    };
    let path = dir.join(file);
    // Trained sharded blocks are gathered from every rank, one block at a time.
    let gathered = !lora && model.sharded().is_some();
    if !write && !gathered {
        return Ok(path);
    }
    if write {
        std::fs::create_dir_all(&dir).map_err(|e| TrainError::io(&dir, e))?;
    }
    if lora {
        model.save_lora(&path)?;
        return Ok(path);
    }
    model.write_weights(write.then_some(path.as_path()))?;
    if write {
        let config = pipe.denoiser_dir().join("config.json");
        let copied = std::fs::copy(&config, dir.join("config.json"));
        copied.map_err(|e| TrainError::io(&config, e))?;
    }
    Ok(path)
}

/// How the exported model samples: the pipeline's own grid at `rollout.eval_steps` with the
/// recipe's CFG, or a few-step student's sigmas without CFG.
#[derive(Debug, Serialize)]
pub struct Sampling {
    pub num_inference_steps: usize,
    /// The student's N + 1 sigmas (1 → 0), when not the pipeline's.
    pub sigmas: Option<Vec<f32>>,
    /// The CFG scale (`None`: no CFG).
    pub guidance_scale: Option<f64>,
}

impl Sampling {
    /// As validation samples: on `grid` without CFG, else the recipe's evaluation sampler.
    pub fn of(recipe: &Recipe, grid: Option<&SigmaGrid>) -> Self {
        match grid {
            Some(grid) => Self {
                num_inference_steps: grid.timesteps.len(),
                sigmas: Some(grid.sigmas.clone()),
                guidance_scale: None,
            },
            None => Self {
                num_inference_steps: recipe.rollout.eval_steps,
                sigmas: None,
                guidance_scale: Some(recipe.rollout.guidance_scale),
            },
        }
    }
}

/// One exported file.
#[derive(Serialize)]
struct File {
    name: String,
    bytes: u64,
    sha256: String,
}

/// Writes `export_manifest.json` beside `files` (the exported weights) after `steps` steps.
pub fn write_manifest(
    recipe: &Recipe,
    pipe: &dyn FlowPipeline,
    files: &[PathBuf],
    steps: u64,
    sampling: &Sampling,
) -> Result<(), TrainError> {
    let Some(dir) = files.first().and_then(|f| f.parent()) else { return Ok(()) };
    let listed = files
        .iter()
        .map(|f| {
            let (bytes, sha256) = digest(f)?;
            let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            Ok(File { name, bytes, sha256 })
        })
        .collect::<Result<Vec<_>, TrainError>>()?;
    let config = pipe.denoiser_dir().join("config.json");
    let manifest = serde_json::json!({
        "algorithm": recipe.algorithm,
        "steps": steps,
        "finetune": recipe.model.finetune,
        "base_model": recipe.model.path,
        "base_transformer_config_sha256": digest(&config)?.1,
        "resolution": recipe.model.resolution,
        "files": listed,
        "sampling": sampling,
    });
    let path = dir.join(MANIFEST);
    let text = serde_json::to_string_pretty(&manifest).expect("a manifest is JSON") + "\n";
    std::fs::write(&path, text).map_err(|e| TrainError::io(&path, e))
}

/// The size and SHA-256 (hex) of `path`.
fn digest(path: &Path) -> Result<(u64, String), TrainError> {
    let mut file = std::fs::File::open(path).map_err(|e| TrainError::io(path, e))?;
    let (mut hasher, mut buffer, mut bytes) = (Sha256::new(), vec![0u8; 1 << 20], 0u64);
    loop {
        let n = file.read(&mut buffer).map_err(|e| TrainError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        bytes += n as u64;
    }
    let hex = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok((bytes, hex))
}
