//! The weights of a trainable model: its base variables, named like the checkpoint, and — when
//! built with LoRA — its adapters in a store of their own with an on/off switch. A family builds
//! its module tree from [`WeightsBuilder::root`] and keeps what [`WeightsBuilder::finish`] returns.

use std::cell::{OnceCell, RefCell};
use std::path::Path;
use std::sync::Arc;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::lora::{AdapterSwitch, Adapters, LoraConfig};
use crate::nn::{LoraScope, Scope};
use crate::sequence::{SequenceParallel, Split, Stream, Ulysses};
use crate::shard::{ShardGroup, ShardMode, ShardedBlocks};
use crate::shard_load::DeferredBlocks;
use crate::switch::Fusing;
use crate::weights::{checkpoint_files, load_weights, store, LoadOptions};
use crate::{ModelError, Unpadding};

/// Base weights and optional adapters.
#[derive(Debug)]
pub struct ModelWeights {
    /// Base weights (frozen when adapters exist).
    pub base: VarStore,
    /// Adapter weights and their switch, when built with LoRA.
    pub adapters: Option<Adapters>,
    /// Whether the transformer blocks recompute their activations in backward
    /// ([`crate::denoiser::TrainableDenoiser::set_gradient_checkpointing`]).
    pub checkpointing: std::cell::Cell<bool>,
    /// Whether padded text may run without its padding (`model.unpadded_attention`, on by
    /// default; [`Self::unpadding`]).
    pub unpadded: std::cell::Cell<bool>,
    /// Whether layers built together on one input run as one GEMM (`model.fused_projections`, on
    /// by default; [`crate::nn::project`]), and which variables lie together.
    pub fused: Fusing,
    /// The lists of transformer blocks in the module tree (`transformer_blocks`, …).
    pub blocks: &'static [&'static str],
    /// The blocks' base weights sharded over the ranks ([`Self::shard_blocks`]).
    pub sharded: OnceCell<ShardedBlocks>,
    /// The ranks that split every sample's tokens with this one (`trainer.sequence_parallel_size`,
    /// [`Self::sequence_parallel`]).
    pub sequence: OnceCell<Ulysses>,
    /// Built under [`crate::shard_load::with_deferred_blocks`]: the block weights are read when
    /// sharded, from [`Self::deferred`].
    pub defers_blocks: bool,
    /// Where the block weights lie until [`Self::shard_blocks`] reads this rank's slices.
    pub deferred: RefCell<Option<DeferredBlocks>>,
}

impl ModelWeights {
    /// The family's `unpadding` while [`Self::unpadded`] is on, [`Unpadding::Keep`] otherwise.
    pub fn unpadding(&self, unpadding: Unpadding) -> Unpadding {
        if self.unpadded.get() {
            unpadding
        } else {
            Unpadding::Keep
        }
    }

    /// Runs block `index` of the block list `list` (`block`, borrowing this model's modules) on
    /// `inputs`, through activation checkpointing when it is switched on and grad is enabled.
    /// Sharded blocks are gathered first and always checkpointed (see [`crate::shard`]). A
    /// sequence-parallel exchange that failed inside the block fails it: the forward here, or
    /// autograd's backward when it recomputes the block (see [`crate::sequence`]).
    pub fn run_block(
        &self,
        list: &str,
        index: usize,
        inputs: &[Tensor],
        block: impl Fn(&[Tensor]) -> Vec<Tensor>,
    ) -> Result<Vec<Tensor>, ModelError> {
        let sequence = self.sequence.get();
        let block = move |t: &[Tensor]| {
            let out = block(t);
            match sequence.and_then(Ulysses::take_failure) {
                Some(e) => Err(e),
                None => Ok(out),
            }
        };
        let Some(sharded) = self.sharded.get() else {
            if !self.checkpointing.get() {
                return block(inputs);
            }
            // SAFETY: the block borrows the model, which outlives the graphs built from its
            // outputs: a training step backpropagates or drops them while the pipeline is loaded.
            return unsafe { flowtune_recompute::checkpointed(inputs, block) };
        };
        let name = format!("{list}.{index}");
        if !flowtune_recompute::grad_enabled() {
            sharded.gather(&name)?;
            let out = block(inputs);
            sharded.release()?;
            return out;
        }
        // Gathered under no-grad for the forward, and again with grad when backward recomputes
        // the block. A failed collective is kept and the block returns nothing, which fails the
        // forward here or autograd's backward (see [`ShardedBlocks::take_failure`]).
        let gathered = move |t: &[Tensor]| {
            if let Err(e) = sharded.gather(&name) {
                sharded.fail(e);
                return Ok(vec![]);
            }
            let out = block(t);
            if !flowtune_recompute::grad_enabled() {
                if let Err(e) = sharded.release() {
                    sharded.fail(e);
                }
            }
            out
        };
        // SAFETY: as above; the weights `gathered` points at stay until the next block's gather,
        // after backward has used this block's recomputed graph.
        let out = unsafe { flowtune_recompute::checkpointed(inputs, gathered) };
        match sharded.take_failure() {
            Some(e) => Err(e),
            None => out,
        }
    }

    /// Splits every sample's tokens over `group` from now on ([`crate::sequence`]); refuses a
    /// group whose size does not divide `family`'s attention `heads`.
    pub fn sequence_parallel(
        &self,
        family: &str,
        heads: i64,
        group: SequenceParallel,
    ) -> Result<(), ModelError> {
        group.check_heads(family, heads)?;
        let _ = self.sequence.set(Ulysses::new(group));
        Ok(())
    }

    /// `tensors`, one per entry of the family's `streams`, as this rank's shares over the model's
    /// sequence-parallel group (as they are without one), and the [`Split`] that gives each
    /// attention its keys and gathers the output; `mask` is the masked key stream's (B, len).
    pub fn split_sequence<const N: usize>(
        &self,
        streams: &[Stream; N],
        tensors: [Tensor; N],
        mask: Option<&Tensor>,
    ) -> (Split<'_>, [Tensor; N]) {
        Split::new(self.sequence.get(), streams, tensors, mask)
    }

    /// Keeps this rank's share of the blocks' base weights only (`trainer.sharding: frozen` or
    /// `full`); each block is gathered when it runs.
    pub fn shard_blocks(
        &self,
        group: Arc<dyn ShardGroup>,
        mode: ShardMode,
        on_host: bool,
    ) -> Result<(), ModelError> {
        let deferred = self.deferred.borrow_mut().take();
        let together = self.fused.groups();
        let sharded = ShardedBlocks::new(
            &self.base,
            self.blocks,
            &together,
            group,
            mode,
            on_host,
            deferred.as_ref(),
        )?;
        self.sharded
            .set(sharded)
            .map_err(|_| ModelError::Input("the blocks are sharded already".into()))
    }
}

/// The stores of a model under construction.
pub struct WeightsBuilder {
    base: VarStore,
    adapters: Option<(VarStore, AdapterSwitch, LoraConfig)>,
    /// Base variables in host memory, their blocks read when sharded ([`crate::shard_load`]).
    deferred: bool,
    fuse: Fusing,
}

impl WeightsBuilder {
    /// Empty stores on `device`: the base weights will be `kind`, the adapters (when `lora` is
    /// given) f32.
    pub fn new(device: Device, kind: Kind, lora: Option<&LoraConfig>) -> Self {
        Self {
            base: store(device, kind),
            adapters: lora.map(|c| (VarStore::new(device), AdapterSwitch::default(), c.clone())),
            deferred: crate::shard_load::deferring(),
            fuse: Fusing::default(),
        }
    }

    /// The root of the module tree: layers built below it get adapters where LoRA targets them.
    pub fn root(&self) -> Scope<'_> {
        let lora = self.adapters.as_ref().map(|(store, switch, config)| LoraScope {
            path: store.root(),
            config,
            switch: switch.clone(),
        });
        let fuse = self.fuse.clone();
        Scope { deferred: self.deferred, fuse, ..Scope::root(self.base.root(), lora) }
    }

    /// The built weights: with adapters, the base is frozen (only adapters train) and the
    /// adapters start fresh ([`Adapters::initialize`], so the model is unchanged); a LoRA pattern
    /// key that names no adapted module is refused here, before any weight is read.
    /// `blocks` names the lists of transformer blocks in the tree (what [`ModelWeights::run_block`]
    /// runs).
    pub fn finish(self, blocks: &'static [&'static str]) -> Result<ModelWeights, ModelError> {
        let mut base = self.base;
        let adapters =
            self.adapters.map(|(store, switch, config)| Adapters { store, switch, config });
        if let Some(adapters) = &adapters {
            adapters.config.validate()?;
            let (variables, config) = (adapters.store.variables(), &adapters.config);
            let adapted: Vec<String> = (variables.keys())
                .filter_map(|n| n.strip_suffix(".lora_A.weight").map(str::to_string))
                .collect();
            let linear: Vec<String> = (base.variables().into_iter())
                .filter(|(_, v)| v.dim() == 2)
                .filter_map(|(n, _)| n.strip_suffix(".weight").map(str::to_string))
                .collect();
            let setting = "model.lora.target_modules";
            let targets = &config.target_modules;
            flowtune_lora_match::check_targets_used(setting, targets, &adapted, &linear)
                .map_err(ModelError::Input)?;
            config.check_patterns_used("model.lora.", &adapted).map_err(ModelError::Input)?;
            base.freeze();
            adapters.initialize(0)?;
        }
        Ok(ModelWeights {
            base,
            adapters,
            checkpointing: Default::default(),
            unpadded: std::cell::Cell::new(true),
            fused: self.fuse,
            blocks,
            sharded: OnceCell::new(),
            sequence: OnceCell::new(),
            defers_blocks: self.deferred,
            deferred: RefCell::new(None),
        })
    }
}

impl ModelWeights {
    /// Loads a diffusers component folder's safetensors (sharded or not) into the base weights as
    /// `kind`; names and shapes are checked.
    pub fn load_base(&mut self, dir: &Path, kind: Kind) -> Result<(), ModelError> {
        if self.defers_blocks {
            let deferred = DeferredBlocks::load(&mut self.base, self.blocks, dir, kind)?;
            *self.deferred.borrow_mut() = Some(deferred);
            return Ok(());
        }
        let options = LoadOptions { kind: Some(kind), ..Default::default() };
        load_weights(&mut self.base, &checkpoint_files(dir)?, options)
    }

    /// A frozen copy of these base weights, in a model `build` makes (as this one, without
    /// adapters, running as this one does): whole, or with the blocks still in their files when
    /// these are.
    pub fn frozen_copy<M>(
        &self,
        build: impl FnOnce() -> Result<M, ModelError>,
        weights: impl FnOnce(&mut M) -> &mut ModelWeights,
    ) -> Result<M, ModelError> {
        let deferred = self.deferred.borrow().clone();
        let mut copy = match deferred {
            Some(_) => crate::shard_load::with_deferred_blocks(build)?,
            None if self.defers_blocks => {
                let message = "a frozen copy of weights whose blocks are sharded already";
                return Err(ModelError::Input(message.into()));
            }
            None => build()?,
        };
        let to = weights(&mut copy);
        crate::denoiser::copy_frozen(&self.base, &mut to.base, |n| {
            deferred.is_none() || crate::shard::block_of(n, self.blocks).is_none()
        })?;
        *to.deferred.borrow_mut() = deferred;
        to.unpadded.set(self.unpadded.get());
        to.fused.switch.set(self.fused.switch.enabled());
        Ok(copy)
    }
}
