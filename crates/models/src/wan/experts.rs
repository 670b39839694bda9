//! Wan2.2-A14B's two experts as one denoiser: `transformer` (high noise) runs the timesteps
//! `t ≥ boundary_ratio · num_train_timesteps`, `transformer_2` (low noise) the others. A batch whose
//! rows straddle the boundary (a replay) is split by rows, each part through its expert, and put
//! back in order; an expert with no rows does not run, so its parameters get no gradient.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tch::{Device, Tensor};

use super::WanTransformer;
use crate::denoiser::{Denoiser, ExampleInputs, ExampleShape, TrainableDenoiser};
use crate::model_weights::ModelWeights;
use crate::{ModelError, TextConditioning};

/// The component name of the low-noise expert, in pipeline folders and LoRA file names.
pub const SECOND_EXPERT: &str = "transformer_2";

/// The high-noise and low-noise experts and the timestep where they hand over.
pub struct WanExperts {
    /// `transformer`: timesteps at or above the boundary.
    pub high: WanTransformer,
    /// `transformer_2`: timesteps below the boundary.
    pub low: WanTransformer,
    /// `boundary_ratio · num_train_timesteps` (875 for Wan2.2-T2V-A14B).
    pub boundary: f64,
}

/// The file beside `path` holding the low-noise expert's part: `<stem>_transformer_2.<ext>`
/// (`pytorch_lora_weights_transformer_2.safetensors`).
pub fn second_expert_file(path: &Path) -> PathBuf {
    let stem = path.file_stem().map_or("".into(), |s| s.to_string_lossy().into_owned());
    let name = match path.extension() {
        Some(ext) => format!("{stem}_{SECOND_EXPERT}.{}", ext.to_string_lossy()),
        None => format!("{stem}_{SECOND_EXPERT}"),
    };
    path.with_file_name(name)
}

impl WanExperts {
    /// The experts with their component names.
    fn both(&self) -> [(&'static str, &WanTransformer); 2] {
        [("transformer", &self.high), (SECOND_EXPERT, &self.low)]
    }

    /// A frozen copy of one expert's base weights, without adapters.
    fn frozen(expert: &WanTransformer) -> Result<WanTransformer, ModelError> {
        let base = &expert.weights.base;
        let build = || WanTransformer::new(&expert.config, base.device(), base.kind(), None);
        expert.weights.frozen_copy(build, |m| &mut m.weights)
    }

    /// Each expert's tensors from `of`, named `<component>.<name>`.
    fn named(
        &self,
        of: impl Fn(&WanTransformer) -> BTreeMap<String, Tensor>,
    ) -> BTreeMap<String, Tensor> {
        self.both()
            .into_iter()
            .flat_map(|(component, expert)| {
                of(expert).into_iter().map(move |(n, t)| (format!("{component}.{n}"), t))
            })
            .collect()
    }
}

impl Denoiser for WanExperts {
    fn velocity(
        &self,
        latents: &Tensor,
        timestep: &Tensor,
        text: &TextConditioning,
    ) -> Result<Tensor, ModelError> {
        if timestep.dim() != 1 {
            return Err(ModelError::Input(format!(
                "the two Wan experts take one timestep per sample, got shape {:?}",
                timestep.size()
            )));
        }
        let high = Vec::<bool>::try_from(timestep.ge(self.boundary).to_device(Device::Cpu))?;
        let rows = |want: bool| -> Vec<i64> {
            (0..high.len() as i64).filter(|&r| high[r as usize] == want).collect()
        };
        let (h, l) = (rows(true), rows(false));
        if l.is_empty() {
            return self.high.velocity(latents, timestep, text);
        }
        if h.is_empty() {
            return self.low.velocity(latents, timestep, text);
        }
        let device = latents.device();
        let part = |expert: &WanTransformer, rows: &[i64]| {
            let index = Tensor::from_slice(rows).to_device(device);
            expert.velocity(
                &latents.index_select(0, &index),
                &timestep.index_select(0, &index),
                &text.rows(&index),
            )
        };
        let v = Tensor::cat(&[part(&self.high, &h)?, part(&self.low, &l)?], 0);
        // Row r of the batch is row `position of r in h ++ l` of `v`.
        let mut back = vec![0i64; high.len()];
        for (i, &r) in h.iter().chain(&l).enumerate() {
            back[r as usize] = i as i64;
        }
        Ok(v.index_select(0, &Tensor::from_slice(&back).to_device(device)))
    }

    fn expert_boundary(&self) -> Option<f64> {
        Some(self.boundary)
    }
}

/// Every store-reading method covers both experts: parameters are named `transformer.<name>` and
/// `transformer_2.<name>`, and files hold the high-noise expert's part at the given path, the
/// low-noise expert's at [`second_expert_file`]. `weights`, `store` and `adapters` are the
/// high-noise expert's (both are built alike).
impl TrainableDenoiser for WanExperts {
    fn weights(&self) -> &ModelWeights {
        &self.high.weights
    }

    fn weights_mut(&mut self) -> &mut ModelWeights {
        &mut self.high.weights
    }

    fn frozen_copy(&self) -> Result<Box<dyn TrainableDenoiser>, ModelError> {
        Ok(Box::new(Self {
            high: Self::frozen(&self.high)?,
            low: Self::frozen(&self.low)?,
            boundary: self.boundary,
        }))
    }

    fn example_inputs(&self, shape: ExampleShape) -> ExampleInputs {
        self.high.example_inputs(shape)
    }

    fn describe(&self) -> String {
        format!("two {} (experts hand over at t = {})", self.high.describe(), self.boundary)
    }

    fn load_lora(&mut self, path: &Path) -> Result<(), ModelError> {
        self.high.load_lora(path)?;
        self.low.load_lora(&second_expert_file(path))
    }

    fn save_lora(&self, path: &Path) -> Result<(), ModelError> {
        self.high.save_lora(path)?;
        self.low.save_lora(&second_expert_file(path))
    }

    fn merge_lora(&self) -> Result<(), ModelError> {
        self.high.merge_lora()?;
        self.low.merge_lora()
    }

    fn set_gradient_checkpointing(&self, on: bool) {
        self.high.set_gradient_checkpointing(on);
        self.low.set_gradient_checkpointing(on);
    }

    fn set_fused_projections(&self, on: bool) {
        self.high.set_fused_projections(on);
        self.low.set_fused_projections(on);
    }

    fn sequence_parallel(
        &self,
        group: crate::sequence::SequenceParallel,
    ) -> Result<(), ModelError> {
        self.high.sequence_parallel(group.clone())?;
        self.low.sequence_parallel(group)
    }

    fn shard_blocks(
        &self,
        group: std::sync::Arc<dyn crate::shard::ShardGroup>,
        mode: crate::shard::ShardMode,
        on_host: bool,
    ) -> Result<(), ModelError> {
        if mode != crate::shard::ShardMode::Frozen {
            let message = "trainer.sharding: full is not built for the two-expert Wan2.2 yet; \
                           use optimizer (ZeRO-1)";
            return Err(ModelError::Input(message.into()));
        }
        self.high.shard_blocks(group.clone(), mode, on_host)?;
        self.low.shard_blocks(group, mode, on_host)
    }

    fn sharded_bytes(&self) -> Option<(i64, i64)> {
        let ((a, b), (c, d)) = (self.high.sharded_bytes()?, self.low.sharded_bytes()?);
        Some((a + c, b.max(d)))
    }

    fn set_adapters_enabled(&self, on: bool) {
        self.high.set_adapters_enabled(on);
        self.low.set_adapters_enabled(on);
    }

    fn full_parameters(&self) -> BTreeMap<String, Tensor> {
        self.named(|e| e.full_parameters())
    }

    fn trainable_parameters(&self) -> BTreeMap<String, Tensor> {
        self.named(|e| e.trainable_parameters())
    }

    fn save_weights(&self, path: &Path) -> Result<(), ModelError> {
        self.high.save_weights(path)?;
        self.low.save_weights(&second_expert_file(path))
    }

    fn load_weights_file(
        &mut self,
        path: &Path,
        block_files: &[std::path::PathBuf],
    ) -> Result<(), ModelError> {
        if !block_files.is_empty() {
            let message = "per-block weight files come from trainer.sharding: full, which the \
                           two-expert Wan2.2 does not support";
            return Err(ModelError::Input(message.into()));
        }
        self.high.load_weights_file(path, &[])?;
        self.low.load_weights_file(&second_expert_file(path), &[])
    }
}

/// Checks that two expert configs agree where the pipeline relies on it (latent and text
/// widths, patch size); the error names both config files.
pub(crate) fn check_same_layout(
    high: &WanTransformer,
    low: &WanTransformer,
    files: [&Path; 2],
) -> Result<(), ModelError> {
    let (a, b) = (&high.config, &low.config);
    let fields = [
        ("in_channels", a.in_channels, b.in_channels),
        (
            "out_channels",
            a.out_channels.unwrap_or(a.in_channels),
            b.out_channels.unwrap_or(b.in_channels),
        ),
        ("text_dim", a.text_dim, b.text_dim),
    ];
    let mut differ: Vec<String> = fields
        .iter()
        .filter(|(_, x, y)| x != y)
        .map(|(k, x, y)| format!("{k} {x} vs {y}"))
        .collect();
    if a.patch_size != b.patch_size {
        differ.push(format!("patch_size {:?} vs {:?}", a.patch_size, b.patch_size));
    }
    if differ.is_empty() {
        return Ok(());
    }
    Err(ModelError::Format {
        path: format!("{} and {}", files[0].display(), files[1].display()),
        message: format!(
            "the two experts must share their latent and text layout: {}",
            differ.join(", ")
        ),
    })
}
