//! Transformer blocks sharded over the ranks of a job (FSDP's full sharding, block by block): each
//! rank keeps 1/N of every block's weights as one flat slice; a block's weights are all-gathered in
//! the model's dtype just before it runs and dropped when the next block is gathered, so a rank
//! holds its slices plus one whole block at a time.
//!
//! Two modes. [`ShardMode::Frozen`] (LoRA) keeps the frozen base weights' slices in the model's
//! dtype. [`ShardMode::Full`] (full fine-tuning) keeps f32 master slices that the optimizer
//! updates ([`ShardedBlocks::masters`]); the gradients a block's weights collect in backward are
//! reduce-scattered (summed over the ranks, in f32, or f64 when exact) into a per-slice sum when
//! the block is dropped, and [`ShardedBlocks::take_gradients`] hands that sum to the masters.
//!
//! The module tree keeps its tensors: gathering points each weight at its part of the gathered
//! buffer, dropping points it at an empty tensor (`Tensor::set_data`, which autograd does not
//! see). A block's weights must therefore stay gathered until the graph of its last run is used:
//! sharded blocks always run through activation checkpointing, whose backward recomputes one
//! block and backpropagates through it before the next block is gathered.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::sync::Arc;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::shard_load::DeferredBlocks;
use crate::ModelError;

/// The collectives sharded weights need.
pub trait ShardGroup: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// `out` = every rank's `shard` concatenated along dim 0, in rank order.
    fn all_gather_into(&self, out: &mut Tensor, shard: &Tensor) -> Result<(), String>;
    /// `out` = this rank's dim-0 block of `full`, summed over the ranks.
    fn reduce_scatter_into(&self, out: &mut Tensor, full: &Tensor) -> Result<(), String>;
}

/// The one rank of a process without a group: its slice is the whole block.
pub struct Alone;

impl ShardGroup for Alone {
    fn rank(&self) -> usize {
        0
    }

    fn size(&self) -> usize {
        1
    }

    fn all_gather_into(&self, out: &mut Tensor, shard: &Tensor) -> Result<(), String> {
        out.f_copy_(shard).map_err(|e| e.to_string())
    }

    fn reduce_scatter_into(&self, out: &mut Tensor, full: &Tensor) -> Result<(), String> {
        out.f_copy_(full).map_err(|e| e.to_string())
    }
}

/// What is sharded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardMode {
    /// Frozen base weights (LoRA): slices in the model's dtype.
    Frozen,
    /// Trained weights: f32 master slices and their summed gradients, in f64 when `exact`.
    Full { exact: bool },
}

/// One block's weights.
struct Unit {
    /// The block's variables (sharing the model's tensors), by checkpoint name, and shapes.
    params: Vec<(String, Tensor, Vec<i64>)>,
    /// This rank's slice of the block's weights, flattened in name order and padded to a
    /// multiple of the ranks: the model's dtype (frozen) or the f32 master (full).
    shard: Tensor,
    /// The sum of this slice's gradients since the last [`ShardedBlocks::take_gradients`] (full).
    grad: Option<Tensor>,
    /// Whether the gathered weights ran under autograd and so may hold gradients (full).
    recorded: Cell<bool>,
}

impl Unit {
    fn numel(&self) -> i64 {
        self.params.iter().map(|(_, _, s)| s.iter().product::<i64>()).sum()
    }
}

/// `vars` (in name order) with each group of `together` placed where its first member was, its
/// members in the group's order.
fn keep_together(vars: Vec<(String, Tensor)>, together: &[Vec<String>]) -> Vec<(String, Tensor)> {
    let group_of = |name: &str| together.iter().find(|g| g.iter().any(|n| n == name));
    let mut placed = std::collections::BTreeSet::new();
    let mut ordered = vec![];
    for (name, _) in &vars {
        let members = match group_of(name) {
            Some(group) => group.clone(),
            None => vec![name.clone()],
        };
        for member in members {
            if placed.insert(member.clone()) {
                if let Some(var) = vars.iter().find(|(n, _)| *n == member) {
                    ordered.push((member, var.1.shallow_clone()));
                }
            }
        }
    }
    ordered
}

/// The sharded blocks of one model.
pub struct ShardedBlocks {
    group: Arc<dyn ShardGroup>,
    mode: ShardMode,
    /// The dtype blocks run in.
    kind: Kind,
    /// The device blocks run on (where they are gathered), and where the slices and their
    /// gradient sums live: the same device, or the host (`trainer.offload: all`).
    device: Device,
    home: Device,
    units: BTreeMap<String, Unit>,
    /// The block whose weights are gathered now.
    gathered: RefCell<Option<String>>,
    /// A collective that failed where no error could be returned (inside autograd's backward).
    failure: RefCell<Option<ModelError>>,
}

impl std::fmt::Debug for ShardedBlocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (rank, size) = (self.group.rank(), self.group.size());
        write!(f, "ShardedBlocks({} blocks, rank {rank} of {size})", self.units.len())
    }
}

/// The block a variable belongs to (`transformer_blocks.3` for
/// `transformer_blocks.3.attn.to_q.weight`) when it sits in one of `lists`.
pub fn block_of(name: &str, lists: &[&str]) -> Option<String> {
    let (list, rest) =
        lists.iter().find_map(|l| Some((*l, name.strip_prefix(l)?.strip_prefix('.')?)))?;
    let index = rest.split('.').next()?;
    index.parse::<usize>().ok().map(|i| format!("{list}.{i}"))
}

fn collective(what: String) -> impl FnOnce(String) -> ModelError {
    move |e| ModelError::Collective(format!("{what}: {e}"))
}

impl ShardedBlocks {
    /// Keeps this rank's slice of every block in `lists` of `store` and drops the rest of their
    /// weights (the store's variables stay, empty until gathered; in name order, except that the
    /// variables of each group in `together` follow one another, so that a gathered block keeps
    /// fused layers' weights as rows of one tensor); with `deferred`, the slices
    /// are read from the checkpoint files instead, the variables never having held the blocks.
    /// With `on_host`, the slices and their gradient sums live in host memory and visit the
    /// device only to be gathered and summed.
    pub fn new(
        store: &VarStore,
        lists: &[&str],
        together: &[Vec<String>],
        group: Arc<dyn ShardGroup>,
        mode: ShardMode,
        on_host: bool,
        deferred: Option<&DeferredBlocks>,
    ) -> Result<Self, ModelError> {
        let mut grouped: BTreeMap<String, Vec<(String, Tensor)>> = BTreeMap::new();
        for (name, var) in store.variables() {
            if let Some(block) = block_of(&name, lists) {
                grouped.entry(block).or_default().push((name, var));
            }
        }
        let Some(kind) = grouped.values().flatten().map(|(_, v)| v.kind()).next() else {
            return Err(ModelError::Input(format!("no weights under {lists:?} to shard")));
        };
        let device = store.device();
        let mut sharded = Self {
            group,
            mode,
            kind,
            device,
            home: if on_host { Device::Cpu } else { device },
            units: BTreeMap::new(),
            gathered: RefCell::new(None),
            failure: RefCell::new(None),
        };
        let _guard = tch::no_grad_guard();
        for (block, mut vars) in grouped {
            vars.sort_by(|a, b| a.0.cmp(&b.0));
            let vars = keep_together(vars, together);
            if let Some((name, v)) = vars.iter().find(|(_, v)| v.kind() != kind) {
                let message = format!(
                    "{name} is {:?}, the other block weights {kind:?}; sharding needs one dtype",
                    v.kind()
                );
                return Err(ModelError::Input(message));
            }
            let shard = match deferred {
                Some(files) => sharded.read_slice(&vars, files)?,
                None => sharded.slice(&Tensor::cat(
                    &vars.iter().map(|(_, v)| v.reshape([-1])).collect::<Vec<_>>(),
                    0,
                )),
            };
            let (shard, grad) = match mode {
                ShardMode::Frozen => (shard, None),
                ShardMode::Full { exact } => {
                    let acc = if exact { Kind::Double } else { Kind::Float };
                    let grad = sharded.pinned(shard.zeros_like().to_kind(acc));
                    (sharded.pinned(shard.to_kind(Kind::Float)).set_requires_grad(true), Some(grad))
                }
            };
            let params = vars
                .into_iter()
                .map(|(name, mut v)| {
                    let shape = v.size();
                    v.set_data(&Tensor::empty([0], (kind, device)));
                    (name, v, shape)
                })
                .collect();
            let unit = Unit { params, shard, grad, recorded: Cell::new(false) };
            sharded.units.insert(block, unit);
        }
        Ok(sharded)
    }

    /// This rank's range of a block's `n` flat values and the padded slice length.
    fn range(&self, n: i64) -> (i64, i64, i64) {
        let (rank, world) = (self.group.rank() as i64, self.group.size() as i64);
        let per_rank = (n + world - 1) / world;
        ((rank * per_rank).min(n), ((rank + 1) * per_rank).min(n), per_rank)
    }

    /// This rank's padded slice of a block's flat values, where slices live.
    fn slice(&self, flat: &Tensor) -> Tensor {
        let (start, end, per_rank) = self.range(flat.numel() as i64);
        let shard = Tensor::zeros([per_rank], (flat.kind(), self.home));
        shard.narrow(0, 0, end - start).copy_(&flat.narrow(0, start, end - start));
        self.pinned(shard)
    }

    /// [`Self::slice`] of the block whose variables (in name order) are `vars`, read from the
    /// checkpoint files: each variable's part of this rank's range, and nothing else.
    fn read_slice(
        &self,
        vars: &[(String, Tensor)],
        files: &DeferredBlocks,
    ) -> Result<Tensor, ModelError> {
        let n: i64 = vars.iter().map(|(_, v)| v.numel() as i64).sum();
        let (start, end, per_rank) = self.range(n);
        let shard = Tensor::zeros([per_rank], (self.kind, self.home));
        let mut offset = 0;
        for (name, var) in vars {
            let len = var.numel() as i64;
            let (from, to) = (start.max(offset), end.min(offset + len));
            if from < to {
                files.read(name, from - offset, &shard.narrow(0, from - start, to - from))?;
            }
            offset += len;
        }
        Ok(self.pinned(shard))
    }

    /// `t` in page-locked host memory when it lives on the host for a GPU (faster, asynchronous
    /// copies to the device); as it is otherwise.
    fn pinned(&self, t: Tensor) -> Tensor {
        match (self.home, self.device) {
            (Device::Cpu, Device::Cuda(_)) => t.pin_memory(self.device),
            _ => t,
        }
    }

    /// Every rank's slices of `block` put together on the device: the block's flat values.
    fn whole(&self, block: &str, shard: &Tensor) -> Result<Tensor, ModelError> {
        let world = self.group.size() as i64;
        let shard = shard.to_device(self.device);
        let mut whole = Tensor::empty([shard.numel() as i64 * world], (shard.kind(), self.device));
        self.group
            .all_gather_into(&mut whole, &shard)
            .map_err(collective(format!("gathering the weights of {block}")))?;
        Ok(whole)
    }

    /// Makes `block`'s weights whole (dropping the block gathered before, if another); a block
    /// that is not sharded is left alone.
    pub fn gather(&self, block: &str) -> Result<(), ModelError> {
        let Some(unit) = self.units.get(block) else { return Ok(()) };
        if flowtune_recompute::grad_enabled() {
            unit.recorded.set(matches!(self.mode, ShardMode::Full { .. }));
        }
        if self.gathered.borrow().as_deref() == Some(block) {
            return Ok(());
        }
        self.release()?;
        let _guard = tch::no_grad_guard();
        let whole = self.whole(block, &unit.shard.detach().to_kind(self.kind))?;
        let mut offset = 0;
        for (_, var, shape) in &unit.params {
            let n: i64 = shape.iter().product();
            var.shallow_clone().set_data(&whole.narrow(0, offset, n).view(shape.as_slice()));
            offset += n;
        }
        *self.gathered.borrow_mut() = Some(block.to_string());
        Ok(())
    }

    /// Drops the gathered block's weights, if any, first summing the gradients they collected
    /// over the ranks into this rank's slice (full).
    pub fn release(&self) -> Result<(), ModelError> {
        let Some(block) = self.gathered.borrow_mut().take() else { return Ok(()) };
        let unit = &self.units[&block];
        let _guard = tch::no_grad_guard();
        if let (true, Some(acc)) = (unit.recorded.replace(false), &unit.grad) {
            let grads: Vec<Tensor> = unit
                .params
                .iter()
                .map(|(_, var, shape)| {
                    let g = var.grad();
                    let g = if g.defined() {
                        g
                    } else {
                        Tensor::zeros(shape.as_slice(), (acc.kind(), self.device))
                    };
                    flowtune_recompute::clear_grad(var);
                    g.reshape([-1]).to_kind(acc.kind())
                })
                .collect();
            let full = Tensor::zeros(
                [acc.numel() as i64 * self.group.size() as i64],
                (acc.kind(), self.device),
            );
            full.narrow(0, 0, unit.numel()).copy_(&Tensor::cat(&grads, 0));
            let mut summed = Tensor::zeros([acc.numel() as i64], (acc.kind(), self.device));
            self.group
                .reduce_scatter_into(&mut summed, &full)
                .map_err(collective(format!("summing the gradients of {block}")))?;
            let _ = acc.shallow_clone().f_add_(&summed.to_device(self.home))?;
        }
        for (_, var, _) in &unit.params {
            var.shallow_clone().set_data(&empty_like(var));
        }
        Ok(())
    }

    /// Keeps `error` for [`Self::take_failure`] (a failure inside a checkpointed block).
    pub fn fail(&self, error: ModelError) {
        self.failure.borrow_mut().get_or_insert(error);
    }

    /// The failure kept by [`Self::fail`], if any.
    pub fn take_failure(&self) -> Option<ModelError> {
        self.failure.borrow_mut().take()
    }

    /// The f32 master slices the optimizer trains, by block name (full).
    pub fn masters(&self) -> BTreeMap<String, Tensor> {
        match self.mode {
            ShardMode::Full { .. } => {
                self.units.iter().map(|(b, u)| (b.clone(), u.shard.shallow_clone())).collect()
            }
            ShardMode::Frozen => BTreeMap::new(),
        }
    }

    /// Drops the gathered block (summing its gradients), then adds every slice's summed gradients
    /// to its master's gradient (rounded to f32 once) and starts the sums again (full).
    pub fn take_gradients(&self) -> Result<(), ModelError> {
        self.release()?;
        for unit in self.units.values() {
            let Some(acc) = &unit.grad else { continue };
            // d/dm Σ m·g = g: autograd puts the sum in the master's gradient, as it would its own.
            let g = acc.to_kind(Kind::Float);
            tch::with_grad(|| (&unit.shard * g).sum(Kind::Float).backward());
            let _ = acc.shallow_clone().f_zero_()?;
        }
        Ok(())
    }

    /// The weights of `block` in the order [`Self::unshard_block`] gives them: names and shapes.
    pub fn block_layout(&self, block: &str) -> Vec<(String, Vec<i64>)> {
        self.units[block].params.iter().map(|(n, _, s)| (n.clone(), s.clone())).collect()
    }

    /// The sharded blocks' names, in order.
    pub fn blocks(&self) -> Vec<String> {
        self.units.keys().cloned().collect()
    }

    /// Every rank's slices of `shards` (one tensor per block, as [`Self::masters`] names them),
    /// gathered and cut into the block weights they hold, by checkpoint name, in `kind`.
    pub fn unshard(
        &self,
        shards: &BTreeMap<String, Tensor>,
        kind: Kind,
    ) -> Result<Vec<(String, Tensor)>, ModelError> {
        let mut named = vec![];
        for block in self.units.keys() {
            named.extend(self.unshard_block(block, &shards[block], kind)?);
        }
        Ok(named)
    }

    /// Every rank's slice `shard` of `block` gathered (every rank calls it) and cut into the
    /// block's weights by checkpoint name, in `kind`, on the device.
    pub fn unshard_block(
        &self,
        block: &str,
        shard: &Tensor,
        kind: Kind,
    ) -> Result<Vec<(String, Tensor)>, ModelError> {
        let _guard = tch::no_grad_guard();
        let whole = self.whole(block, &shard.detach().contiguous())?;
        let mut offset = 0;
        let mut named = vec![];
        for (name, _, shape) in &self.units[block].params {
            let n: i64 = shape.iter().product();
            named.push((
                name.clone(),
                whole.narrow(0, offset, n).view(shape.as_slice()).to_kind(kind),
            ));
            offset += n;
        }
        Ok(named)
    }

    /// This rank's slice of each block from whole block weights by checkpoint name (the inverse
    /// of [`Self::unshard`]); `None` when `named` lacks one of a block's weights.
    pub fn reshard(&self, named: &BTreeMap<String, Tensor>) -> Option<BTreeMap<String, Tensor>> {
        let slices = self.units.keys().map(|b| Some((b.clone(), self.reshard_block(b, named)?)));
        slices.collect()
    }

    /// This rank's slice of `block` (f32) from its whole weights by checkpoint name; `None` when
    /// `named` lacks one of them.
    pub fn reshard_block(&self, block: &str, named: &BTreeMap<String, Tensor>) -> Option<Tensor> {
        let _guard = tch::no_grad_guard();
        let unit = self.units.get(block)?;
        let parts = unit
            .params
            .iter()
            .map(|(name, ..)| Some(named.get(name)?.reshape([-1]).to_kind(Kind::Float)))
            .collect::<Option<Vec<_>>>()?;
        Some(self.slice(&Tensor::cat(&parts, 0)))
    }

    /// Whether the slices are trained weights (full), not frozen ones.
    pub fn trains(&self) -> bool {
        matches!(self.mode, ShardMode::Full { .. })
    }

    /// The dtype blocks run in.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Whether `name` is a weight inside a sharded block.
    pub fn holds(&self, name: &str) -> bool {
        self.units.values().any(|u| u.params.iter().any(|(n, ..)| n == name))
    }

    /// Bytes of block weights this rank keeps between blocks (its slices).
    pub fn shard_bytes(&self) -> i64 {
        self.units.values().map(|u| u.shard.numel() as i64 * bytes(u.shard.kind())).sum()
    }

    /// Bytes of the largest block, gathered.
    pub fn largest_block_bytes(&self) -> i64 {
        self.units.values().map(|u| u.numel() * bytes(self.kind)).max().unwrap_or(0)
    }
}

fn bytes(kind: Kind) -> i64 {
    kind.elt_size_in_bytes() as i64
}

/// A tensor of no elements with `t`'s kind and device.
fn empty_like(t: &Tensor) -> Tensor {
    Tensor::empty([0], (t.kind(), t.device()))
}

#[cfg(test)]
mod tests {
    use super::block_of;

    #[test]
    fn weights_belong_to_their_block() {
        let lists = ["transformer_blocks", "single_transformer_blocks"];
        let block = |n| block_of(n, &lists);
        assert_eq!(
            block("transformer_blocks.12.attn.to_q.weight").as_deref(),
            Some("transformer_blocks.12")
        );
        assert_eq!(
            block("single_transformer_blocks.0.proj_out.bias").as_deref(),
            Some("single_transformer_blocks.0")
        );
        assert_eq!(block("transformer_blocks_extra.1.w"), None);
        assert_eq!(block("proj_out.weight"), None);
    }
}
