//! Loading a denoiser whose blocks will be sharded (`trainer.sharding: frozen|full`) without
//! reading them whole: under [`with_deferred_blocks`] a denoiser's variables are built in
//! untouched host memory (no pages, no device memory), loading copies only the weights outside
//! the blocks onto the device and notes where every block weight lies in the mapped checkpoint
//! files ([`DeferredBlocks`]), and sharding reads each rank's slice of every block straight from
//! those files ([`crate::shard::ShardedBlocks`]). A rank's load peak is then the weights outside
//! the blocks plus its slices, not the whole model.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::PathBuf;

use tch::nn::VarStore;
use tch::{Kind, Tensor};

use crate::shard::block_of;
use crate::weights::{checkpoint_files, visit, LoadOptions, Stored};
use crate::ModelError;

thread_local! {
    static DEFERRING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` (loading a pipeline) with its denoisers' block weights left in their files until
/// the blocks are sharded; a denoiser loaded so must be sharded before it runs. Not under
/// random weights, which are made in place.
pub fn with_deferred_blocks<T>(f: impl FnOnce() -> T) -> T {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            DEFERRING.with(|d| d.set(self.0));
        }
    }
    let _reset = Reset(DEFERRING.with(|d| d.replace(true)));
    f()
}

/// Whether denoisers built now defer their blocks.
pub(crate) fn deferring() -> bool {
    DEFERRING.with(Cell::get) && crate::random::active_seed().is_none()
}

/// The block weights of a denoiser still in its checkpoint files, by variable name.
#[derive(Clone)]
pub struct DeferredBlocks {
    stored: BTreeMap<String, Stored>,
    /// The component folder, for errors.
    pub dir: PathBuf,
}

impl std::fmt::Debug for DeferredBlocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeferredBlocks({} weights in {})", self.stored.len(), self.dir.display())
    }
}

impl DeferredBlocks {
    /// Loads the variables of `store` outside the block lists `lists` from the checkpoint of
    /// component folder `dir` (names and shapes checked, converted to `kind`) onto the store's
    /// device, and notes where the block weights lie.
    pub(crate) fn load(
        store: &mut VarStore,
        lists: &[&str],
        dir: &std::path::Path,
        kind: Kind,
    ) -> Result<Self, ModelError> {
        store.set_kind(kind);
        let device = store.device();
        let options = LoadOptions { kind: Some(kind), ..Default::default() };
        let mut stored = BTreeMap::new();
        visit(store, &checkpoint_files(dir)?, options, |name, var, at| {
            if block_of(name, lists).is_some() {
                stored.insert(name.to_string(), at);
                return Ok(());
            }
            let on_device = Tensor::empty(var.size(), (var.kind(), device));
            at.read_into(0, &on_device.view([-1]))?;
            var.shallow_clone().set_data(&on_device);
            Ok(())
        })?;
        Ok(Self { stored, dir: dir.to_path_buf() })
    }

    /// Fills the flat `dest` with elements `start..start + dest.numel()` of variable `name`.
    pub(crate) fn read(&self, name: &str, start: i64, dest: &Tensor) -> Result<(), ModelError> {
        let stored = self.stored.get(name).ok_or_else(|| {
            ModelError::Input(format!("{}: no block weight {name} to shard", self.dir.display()))
        })?;
        stored.read_into(start, dest)
    }
}
