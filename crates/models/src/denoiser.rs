//! The denoiser seam: a network predicting the flow-matching velocity, and what training needs of
//! it (adapters, trainable tensors, a frozen copy). A family implements [`Denoiser::velocity`] and
//! the few store accessors of [`TrainableDenoiser`]; LoRA plumbing, weight files and classifier-free
//! guidance come with the traits.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flowtune_sampling::upload;
use tch::nn::VarStore;
use tch::{Kind, Tensor};

use crate::lora::{self, Adapters};
use crate::model_weights::ModelWeights;
use crate::sequence::SequenceParallel;
use crate::shard::{ShardGroup, ShardMode, ShardedBlocks};
use crate::weights::{load_weights, LoadOptions};
use crate::{ModelError, TextConditioning, Unpadding};

/// A flow-matching denoiser: velocity of latents at timesteps (0‥1000) given text.
pub trait Denoiser {
    /// Velocity (same shape as `latents`) at `timestep` (B,) given `text`.
    fn velocity(
        &self,
        latents: &Tensor,
        timestep: &Tensor,
        text: &TextConditioning,
    ) -> Result<Tensor, ModelError>;

    /// Whether the conditional and unconditional rows of CFG go through one batched forward
    /// (both sides must then have the same token length); otherwise two forwards.
    fn batched_cfg(&self) -> bool {
        true
    }

    /// Whether CFG runs at `scale`, as the family's diffusers pipeline decides: `scale > 1` by
    /// default (SD3, Wan's `do_classifier_free_guidance`; FLUX.1's and Qwen-Image's
    /// `true_cfg_scale > 1`, flowtune always giving a negative prompt); Z-Image overrides it.
    fn runs_cfg(&self, scale: f64) -> bool {
        scale > 1.0
    }

    /// The family's CFG combination of f32 velocities: plain `u + g·(c − u)` by default; a family
    /// with "true CFG" and norm rescale (Qwen-Image) overrides it.
    fn combine_guidance(&self, cond: &Tensor, uncond: &Tensor, scale: f64) -> Tensor {
        uncond + (cond - uncond) * scale
    }

    /// CFG `u + g·(c − u)` of f32 velocities rescaled, token by token, to the conditional
    /// velocity's norm over the token's channels (DMD2's teacher under `cfg_norm: layer_norm`):
    /// the tokens are the latent positions by default, a family's packed patches where its
    /// transformer packs them (Qwen-Image, whose true CFG this is).
    fn norm_rescaled_guidance(&self, cond: &Tensor, uncond: &Tensor, scale: f64) -> Tensor {
        rescaled_guidance(cond, uncond, scale, &[1])
    }

    /// The timestep where a two-expert denoiser (Wan2.2-A14B) hands over: its high-noise expert
    /// runs at `t ≥ boundary`, its low-noise expert (CFG scale [`CfgScale::scale_2`]) below.
    /// `None` for a single network.
    fn expert_boundary(&self) -> Option<f64> {
        None
    }

    /// How rows padded to one text length may run without their padding; see [`Unpadding`].
    fn unpadding(&self) -> Unpadding {
        Unpadding::Keep
    }
}

/// [`Denoiser::velocity`], without the text's padding where [`Denoiser::unpadding`] and the
/// rows' host token counts ([`TextConditioning::lengths`]) allow: rows of one token count run
/// together, trimmed and unmasked, and the velocities come back in the rows' order.
pub fn unpadded_velocity<D: Denoiser + ?Sized>(
    model: &D,
    latents: &Tensor,
    timestep: &Tensor,
    text: &TextConditioning,
) -> Result<Tensor, ModelError> {
    let full = text.embeds.size()[1];
    let lengths = match (&text.mask, &text.lengths, model.unpadding()) {
        (Some(_), Some(lengths), unpadding) if unpadding != Unpadding::Keep => lengths,
        _ => return model.velocity(latents, timestep, text),
    };
    let mut groups: Vec<(i64, Vec<i64>)> = vec![];
    for (row, &len) in lengths.iter().enumerate() {
        match groups.iter_mut().find(|(l, _)| *l == len) {
            Some((_, rows)) => rows.push(row as i64),
            None => groups.push((len, vec![row as i64])),
        }
    }
    match (model.unpadding(), groups.as_slice()) {
        (_, [(len, _)]) if *len == full => model.velocity(latents, timestep, &text.trimmed(full)),
        (Unpadding::Regroup, [(len, _)]) if *len > 0 => {
            model.velocity(latents, timestep, &text.trimmed(*len))
        }
        (Unpadding::Regroup, _) if groups.iter().all(|(len, _)| *len > 0) => {
            let device = latents.device();
            let mut parts = vec![];
            for (len, rows) in &groups {
                let index = upload(Tensor::from_slice(rows), device);
                let rows_text = text.rows_at(rows).trimmed(*len);
                let (x, t) = (latents.index_select(0, &index), timestep.index_select(0, &index));
                parts.push(model.velocity(&x, &t, &rows_text)?);
            }
            // Row r of the output is part row `place[r]` of the groups concatenated.
            let mut place = vec![0i64; lengths.len()];
            for (at, &row) in groups.iter().flat_map(|(_, rows)| rows).enumerate() {
                place[row as usize] = at as i64;
            }
            let place = upload(Tensor::from_slice(&place), device);
            Ok(Tensor::cat(&parts, 0).index_select(0, &place))
        }
        _ => model.velocity(latents, timestep, text),
    }
}

/// Classifier-free guidance scales: `scale`, except at the low-noise expert's timesteps of a
/// two-expert denoiser, which take `scale_2` when given (diffusers' `guidance_scale_2`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CfgScale {
    pub scale: f64,
    pub scale_2: Option<f64>,
}

impl From<f64> for CfgScale {
    fn from(scale: f64) -> Self {
        Self { scale, scale_2: None }
    }
}

/// The velocity in f32, with classifier-free guidance when `negative` is given: the one place CFG
/// is computed, for rollouts and replays alike. Each row takes the scale of its timestep's expert
/// ([`CfgScale`]).
pub fn guided_velocity<D: Denoiser + ?Sized>(
    model: &D,
    latents: &Tensor,
    timestep: &Tensor,
    text: &TextConditioning,
    negative: Option<&TextConditioning>,
    scale: impl Into<CfgScale>,
) -> Result<Tensor, ModelError> {
    let scale = scale.into();
    let combine = |cond: &Tensor, uncond: &Tensor| match (scale.scale_2, model.expert_boundary()) {
        (Some(scale_2), Some(boundary)) if scale_2 != scale.scale => {
            let mut shape = vec![1i64; cond.dim()];
            shape[0] = -1;
            let low = timestep.lt(boundary).view(shape.as_slice());
            let high = model.combine_guidance(cond, uncond, scale.scale);
            model.combine_guidance(cond, uncond, scale_2).where_self(&low, &high)
        }
        _ => model.combine_guidance(cond, uncond, scale.scale),
    };
    let Some(negative) = negative else {
        return Ok(unpadded_velocity(model, latents, timestep, text)?.to_kind(Kind::Float));
    };
    if model.batched_cfg() {
        let out = unpadded_velocity(
            model,
            &Tensor::cat(&[latents, latents], 0),
            &Tensor::cat(&[timestep, timestep], 0),
            &negative.concat(text),
        )?
        .to_kind(Kind::Float);
        let parts = out.chunk(2, 0);
        Ok(combine(&parts[1], &parts[0]))
    } else {
        let uncond = unpadded_velocity(model, latents, timestep, negative)?.to_kind(Kind::Float);
        let cond = unpadded_velocity(model, latents, timestep, text)?.to_kind(Kind::Float);
        Ok(combine(&cond, &uncond))
    }
}

/// "True CFG" with norm rescale (Qwen-Image's): the plain combination, scaled back at every
/// position to the norm of the conditional velocity over `dims` (the packed channel dimension,
/// for Qwen-Image). For a [`Denoiser::combine_guidance`] override.
pub fn rescaled_guidance(cond: &Tensor, uncond: &Tensor, scale: f64, dims: &[i64]) -> Tensor {
    let combined = uncond + (cond - uncond) * scale;
    let norm = |t: &Tensor| t.norm_scalaropt_dim(2, dims, true);
    let ratio = norm(cond) / norm(&combined).clamp_min(1e-12);
    combined * ratio
}

/// The conditional velocity (no CFG) at noise level `sigma` (B,) in f32: what the forward-process
/// losses (DPO, NFT) and pre-training regress.
pub fn velocity_at_sigma<D: Denoiser + ?Sized>(
    model: &D,
    latents: &Tensor,
    sigma: &Tensor,
    text: &TextConditioning,
) -> Result<Tensor, ModelError> {
    Ok(unpadded_velocity(model, latents, &(sigma * 1000.0), text)?.to_kind(Kind::Float))
}

/// The size of made-up inputs: `batch` samples of `frames` × `height` × `width` latent cells and
/// `text_len` text tokens (picture denoisers take one frame and ignore `frames`).
#[derive(Debug, Clone, Copy)]
pub struct ExampleShape {
    pub batch: i64,
    pub frames: i64,
    pub height: i64,
    pub width: i64,
    pub text_len: i64,
}

/// Made-up inputs of the right shapes for a denoiser (benchmarks, smoke tests).
pub struct ExampleInputs {
    pub latents: Tensor,
    pub timestep: Tensor,
    pub text: TextConditioning,
    /// Image (or video) tokens the transformer attends over, for throughput figures.
    pub tokens: i64,
}

/// A denoiser the trainer can train: its base weights, optional LoRA adapters and a frozen copy.
pub trait TrainableDenoiser: Denoiser {
    /// Base weights and adapters ([`crate::model_weights::WeightsBuilder`] builds them).
    fn weights(&self) -> &ModelWeights;
    fn weights_mut(&mut self) -> &mut ModelWeights;
    /// A copy of the base weights without adapters, frozen: the reference of full fine-tuning.
    fn frozen_copy(&self) -> Result<Box<dyn TrainableDenoiser>, ModelError>;
    /// Random inputs of `shape`.
    fn example_inputs(&self, shape: ExampleShape) -> ExampleInputs;
    /// One line for benchmark output (layers, width).
    fn describe(&self) -> String;

    /// Base weights, by checkpoint name (frozen when adapters exist).
    fn store(&self) -> &VarStore {
        &self.weights().base
    }

    /// Adapter weights and their switch, when built with LoRA.
    fn adapters(&self) -> Option<&Adapters> {
        self.weights().adapters.as_ref()
    }

    /// Base tensors that are buffers in the reference implementation (never trained).
    fn buffers(&self) -> &'static [&'static str] {
        &[]
    }

    /// The adapter prefix in LoRA files (`transformer.<module>.lora_A.weight`).
    fn lora_prefix(&self) -> &'static str {
        "transformer"
    }

    /// Loads adapter weights saved in the diffusers/PEFT layout.
    fn load_lora(&mut self, path: &Path) -> Result<(), ModelError> {
        let prefix = self.lora_prefix();
        let adapters = self.weights_mut().adapters.as_mut().ok_or_else(no_adapters)?;
        lora::load(&mut adapters.store, prefix, path)
    }

    /// Writes the adapters in the diffusers/PEFT layout with their config (see [`lora::save`]).
    fn save_lora(&self, path: &Path) -> Result<(), ModelError> {
        let adapters = self.adapters().ok_or_else(no_adapters)?;
        lora::save(&adapters.store, &adapters.config, self.lora_prefix(), path)
    }

    /// Folds the adapters into the base weights and switches them off (see [`Adapters::merge_into`]).
    fn merge_lora(&self) -> Result<(), ModelError> {
        refuse_sharded(self.weights(), "merging the LoRA into the base weights")?;
        self.adapters().ok_or_else(no_adapters)?.merge_into(self.store())
    }

    /// Recompute each transformer block's activations in backward instead of keeping them
    /// (`trainer.gradient_checkpointing`): less memory, one more block forward per backward.
    fn set_gradient_checkpointing(&self, on: bool) {
        self.weights().checkpointing.set(on);
    }

    /// Whether padded text runs without its padding where the family allows it
    /// (`model.unpadded_attention`; see [`Unpadding`]).
    fn set_unpadded_attention(&self, on: bool) {
        self.weights().unpadded.set(on);
    }

    /// Whether layers built together on one input run as one GEMM (`model.fused_projections`;
    /// see [`crate::nn::project`]).
    fn set_fused_projections(&self, on: bool) {
        self.weights().fused.switch.set(on);
    }

    /// Keeps this rank's share of the transformer blocks' base weights only, gathering each block
    /// over `group` when it runs (`trainer.sharding: frozen` or `full`); the slices live on the
    /// host with `on_host` (`trainer.offload: all`).
    fn shard_blocks(
        &self,
        group: Arc<dyn ShardGroup>,
        mode: ShardMode,
        on_host: bool,
    ) -> Result<(), ModelError> {
        self.weights().shard_blocks(group, mode, on_host)
    }

    /// Splits every sample's tokens over `group`'s ranks, attention exchanging them (see
    /// [`crate::sequence`]); a family without sequence-parallel attention, or whose heads do not
    /// divide by the group size, refuses.
    fn sequence_parallel(&self, group: SequenceParallel) -> Result<(), ModelError> {
        let _ = group;
        Err(ModelError::Input(
            "this family has no sequence-parallel attention; trainer.sequence_parallel_size must be 1"
                .into(),
        ))
    }

    /// The sharded blocks of a model that has one set of them (not the two-expert Wan).
    fn sharded(&self) -> Option<&ShardedBlocks> {
        self.weights().sharded.get()
    }

    /// Bytes of sharded block weights this rank keeps, and of the largest block gathered.
    fn sharded_bytes(&self) -> Option<(i64, i64)> {
        let sharded = self.weights().sharded.get()?;
        Some((sharded.shard_bytes(), sharded.largest_block_bytes()))
    }

    /// Turns the adapters on or off (off: the base model, the KL reference).
    fn set_adapters_enabled(&self, on: bool) {
        if let Some(adapters) = self.adapters() {
            adapters.switch.set(on);
        }
    }

    /// Every base weight full fine-tuning trains, by checkpoint name; buffers are marked as not
    /// requiring gradients and left out.
    fn full_parameters(&self) -> BTreeMap<String, Tensor> {
        let buffers = self.buffers();
        self.store()
            .variables()
            .into_iter()
            .filter_map(|(name, var)| {
                let trainable = !buffers.contains(&name.as_str());
                let var = var.set_requires_grad(trainable);
                trainable.then_some((name, var))
            })
            .collect()
    }

    /// What trains: the adapters when there are some, else every base weight (a sharded block's
    /// weights as the block's master slice).
    fn trainable_parameters(&self) -> BTreeMap<String, Tensor> {
        match self.adapters() {
            Some(adapters) => adapters.store.variables().into_iter().collect(),
            None => {
                // Sharded blocks train through their f32 master slices, named by block.
                let mut params = self.full_parameters();
                if let Some(sharded) = self.sharded() {
                    params.retain(|name, _| !sharded.holds(name));
                    params.extend(sharded.masters());
                }
                params
            }
        }
    }

    /// Writes every base weight as the safetensors file `path` (only the writing rank passes
    /// one; every rank calls it): trained sharded blocks are gathered one at a time with the
    /// other ranks and streamed to the file, so no rank holds the whole model.
    fn write_weights(&self, path: Option<&Path>) -> Result<(), ModelError> {
        let Some(sharded) = self.sharded().filter(|s| s.trains()) else {
            return path.map_or(Ok(()), |p| self.save_weights(p));
        };
        let mut others: Vec<(String, Tensor)> =
            self.store().variables().into_iter().filter(|(n, _)| !sharded.holds(n)).collect();
        others.sort_by(|a, b| a.0.cmp(&b.0));
        let mut layout: Vec<_> =
            others.iter().map(|(n, t)| (n.clone(), t.size(), t.kind())).collect();
        for block in sharded.blocks() {
            let weights = sharded.block_layout(&block).into_iter();
            layout.extend(weights.map(|(n, shape)| (n, shape, sharded.kind())));
        }
        let create = |p| crate::streamed::StreamedSafetensors::create(p, layout);
        let mut file = path.map(create).transpose()?;
        for (name, t) in &others {
            file.as_mut().map_or(Ok(()), |f| f.write(name, t))?;
        }
        let masters = sharded.masters();
        for block in sharded.blocks() {
            for (name, t) in sharded.unshard_block(&block, &masters[&block], sharded.kind())? {
                file.as_mut().map_or(Ok(()), |f| f.write(&name, &t))?;
            }
        }
        file.map_or(Ok(()), |f| f.finish())
    }

    /// Writes every base weight (checkpoint names, on the CPU) as one safetensors file.
    fn save_weights(&self, path: &Path) -> Result<(), ModelError> {
        Ok(Tensor::write_safetensors(&self.named_weights()?, path)?)
    }

    /// Every base weight by checkpoint name, on the CPU, in name order. With trained sharded
    /// blocks, their slices are gathered from every rank (so every rank must call it).
    fn named_weights(&self) -> Result<Vec<(String, Tensor)>, ModelError> {
        let sharded = self.sharded();
        if sharded.is_some_and(|s| !s.trains()) {
            refuse_sharded(self.weights(), "saving the base weights")?;
        }
        let mut named: Vec<(String, Tensor)> = self
            .store()
            .variables()
            .into_iter()
            .filter(|(n, _)| !sharded.is_some_and(|s| s.holds(n)))
            .map(|(n, t)| (n, t.detach().to_device(tch::Device::Cpu)))
            .collect();
        if let Some(sharded) = sharded {
            let blocks = sharded.unshard(&sharded.masters(), sharded.kind())?;
            named.extend(blocks.into_iter().map(|(n, t)| (n, t.to_device(tch::Device::Cpu))));
        }
        named.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(named)
    }

    /// Reads base weights saved by [`Self::save_weights`], or the weights outside the blocks
    /// (`path`) and each block's own file (`block_files`) of a sharded checkpoint; names and
    /// shapes checked. Trained sharded blocks take this rank's slices of theirs, reading one
    /// file at a time.
    fn load_weights_file(
        &mut self,
        path: &Path,
        block_files: &[PathBuf],
    ) -> Result<(), ModelError> {
        let files: Vec<PathBuf> =
            std::iter::once(path.to_path_buf()).chain(block_files.iter().cloned()).collect();
        let Some(sharded) = self.sharded() else {
            return load_weights(&mut self.weights_mut().base, &files, LoadOptions::default());
        };
        let (mut blocks, mut others): (BTreeSet<String>, BTreeSet<String>) = Default::default();
        let masters = sharded.masters();
        let variables = self.store().variables();
        let _guard = tch::no_grad_guard();
        for file in &files {
            let named: BTreeMap<String, Tensor> =
                Tensor::read_safetensors(file)?.into_iter().collect();
            for (block, master) in &masters {
                if let Some(slice) = sharded.reshard_block(block, &named) {
                    master.shallow_clone().copy_(&slice);
                    blocks.insert(block.clone());
                }
            }
            for (name, var) in variables.iter().filter(|(n, _)| !sharded.holds(n)) {
                let Some(saved) = named.get(name) else { continue };
                if saved.size() != var.size() {
                    return Err(ModelError::Shape {
                        path: file.display().to_string(),
                        name: name.clone(),
                        expected: var.size(),
                        found: saved.size(),
                    });
                }
                var.shallow_clone().copy_(saved);
                others.insert(name.clone());
            }
        }
        let missing =
            masters.keys().filter(|b| !blocks.contains(*b)).cloned().chain(
                variables.keys().filter(|n| !sharded.holds(n) && !others.contains(*n)).cloned(),
            );
        let missing: Vec<String> = missing.collect();
        if !missing.is_empty() {
            let names = missing.join(", ");
            return Err(ModelError::Missing { path: path.display().to_string(), names });
        }
        Ok(())
    }

    /// The reference implementation's forward on its own argument names (`hidden_states`,
    /// `timestep`, …, without the `input.` prefix), for `flowtune debug forward`. By default the
    /// velocity, for families whose forward takes the velocity's layout and timestep scale.
    fn forward_named(&self, inputs: &HashMap<String, Tensor>) -> Result<Tensor, ModelError> {
        let get = |name: &str| {
            inputs.get(name).ok_or_else(|| ModelError::Input(format!("no input `{name}`")))
        };
        let text = TextConditioning::from_named(inputs)?;
        self.velocity(get("hidden_states")?, get("timestep")?, &text)
    }
}

fn no_adapters() -> ModelError {
    ModelError::Input("the model was built without LoRA adapters".into())
}

/// Copies the base weights of `from` that `copied` names into the same-named variables of `to`
/// (made there as copies on `from`'s devices) and freezes `to`.
pub fn copy_frozen(
    from: &VarStore,
    to: &mut VarStore,
    copied: impl Fn(&str) -> bool,
) -> Result<(), ModelError> {
    if let Some(kind) = from.variables().values().next().map(Tensor::kind) {
        to.set_kind(kind);
    }
    let targets = to.variables();
    let _guard = tch::no_grad_guard();
    for (name, var) in from.variables().into_iter().filter(|(n, _)| copied(n)) {
        let target = targets.get(&name).ok_or_else(|| {
            ModelError::Input(format!("copying frozen weights: {name} is not in the copy"))
        })?;
        // Copied in place where it fits, so that layers laid out together stay so.
        let fits = target.kind() == var.kind()
            && target.device() == var.device()
            && target.size() == var.size();
        match fits {
            true => target.shallow_clone().copy_(&var.detach()),
            false => target.shallow_clone().set_data(&var.detach().copy()),
        }
    }
    to.freeze();
    Ok(())
}

/// A denoiser from a diffusers `transformer/` directory: `build` makes the module tree from
/// `config.json` (a config it refuses is named by that file), then the base weights load
/// (safetensors, sharded or not) in `kind`.
pub(crate) fn load_component<C: serde::de::DeserializeOwned, M>(
    dir: &Path,
    kind: Kind,
    build: impl FnOnce(&C) -> Result<M, ModelError>,
    weights: impl FnOnce(&mut M) -> &mut ModelWeights,
) -> Result<M, ModelError> {
    let file = dir.join("config.json");
    let config: C = crate::read_config(&file)?;
    let mut model =
        build(&config).map_err(|e| ModelError::Input(format!("{}: {e}", file.display())))?;
    weights(&mut model).load_base(dir, kind)?;
    Ok(model)
}

/// [`TrainableDenoiser`]'s `weights`, `weights_mut` and `frozen_copy` for a model with fields
/// `weights` and `config` and a constructor `Self::new(&config, device, kind, lora)`.
macro_rules! weights_and_frozen_copy {
    () => {
        fn weights(&self) -> &$crate::model_weights::ModelWeights {
            &self.weights
        }

        fn weights_mut(&mut self) -> &mut $crate::model_weights::ModelWeights {
            &mut self.weights
        }

        fn frozen_copy(
            &self,
        ) -> Result<Box<dyn $crate::denoiser::TrainableDenoiser>, $crate::ModelError> {
            let base = &self.weights.base;
            let build = || Self::new(&self.config, base.device(), base.kind(), None);
            let copy = self.weights.frozen_copy(build, |m: &mut Self| &mut m.weights)?;
            Ok(Box::new(copy))
        }
    };
}
pub(crate) use weights_and_frozen_copy;

/// Fails on a model whose blocks are sharded: its base weights are not all on this rank.
fn refuse_sharded(weights: &ModelWeights, what: &str) -> Result<(), ModelError> {
    match weights.sharded.get() {
        Some(_) => Err(ModelError::Input(format!(
            "{what} needs every base weight, but trainer.sharding: frozen keeps 1/N of each block on this rank"
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rescaled_guidance_keeps_the_conditional_norm_per_position() {
        let cond = Tensor::from_slice(&[3.0f32, 4.0, 1.0, 0.0]).view([2, 2]);
        let uncond = Tensor::from_slice(&[1.0f32, 0.0, 0.0, 1.0]).view([2, 2]);
        let out = rescaled_guidance(&cond, &uncond, 3.0, &[1]);
        // Row 0: plain [7, 12] has norm √193, rescaled to ‖(3, 4)‖ = 5.
        let plain =
            Vec::<f32>::try_from((&uncond + (&cond - &uncond) * 3.0).flatten(0, -1)).unwrap();
        let got = Vec::<f32>::try_from(out.flatten(0, -1)).unwrap();
        let s0 = 5.0 / (plain[0].powi(2) + plain[1].powi(2)).sqrt();
        let s1 = 1.0 / (plain[2].powi(2) + plain[3].powi(2)).sqrt();
        let want = [plain[0] * s0, plain[1] * s0, plain[2] * s1, plain[3] * s1];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
        // Scale 1 is the conditional velocity itself.
        let same = rescaled_guidance(&cond, &uncond, 1.0, &[1]);
        assert!(same.allclose(&cond, 1e-6, 1e-6, false));
    }
}
