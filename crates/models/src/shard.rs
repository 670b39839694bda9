//! Frozen weights sharded over the ranks of a job (FSDP's full sharding of parameters that do
//! not train): each rank keeps 1/N of every transformer block's base weights as one flat slice;
//! a block's weights are all-gathered just before it runs and dropped when the next block is
//! gathered, so a rank holds its slices plus one whole block at a time.
//!
//! The module tree keeps its tensors: gathering points each weight at its part of the gathered
//! buffer, dropping points it at an empty tensor (`Tensor::set_data`, which autograd does not
//! see). A block's weights must therefore stay gathered until the graph of its last run is used:
//! sharded blocks always run through activation checkpointing, whose backward recomputes one
//! block and backpropagates through it before the next block is gathered.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;

use tch::nn::VarStore;
use tch::{Kind, Tensor};

use crate::ModelError;

/// The collective sharded weights need: the ranks' slices, concatenated in rank order.
pub trait ShardGroup: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// `out` = every rank's `shard` concatenated along dim 0, in rank order.
    fn all_gather_into(&self, out: &mut Tensor, shard: &Tensor) -> Result<(), String>;
}

/// One block's weights.
struct Unit {
    /// The block's variables (sharing the model's tensors), by name, and their shapes.
    params: Vec<(Tensor, Vec<i64>)>,
    /// This rank's slice of the block's weights, flattened in name order and padded to a
    /// multiple of the ranks.
    shard: Tensor,
}

/// The sharded blocks of one model.
pub struct ShardedBlocks {
    group: Arc<dyn ShardGroup>,
    units: BTreeMap<String, Unit>,
    /// The block whose weights are gathered now.
    gathered: RefCell<Option<String>>,
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

impl ShardedBlocks {
    /// Keeps this rank's slice of every block in `lists` of `store` and drops the rest of their
    /// weights (the stores' variables stay, empty until gathered).
    pub fn new(
        store: &VarStore,
        lists: &[&str],
        group: Arc<dyn ShardGroup>,
    ) -> Result<Self, ModelError> {
        let mut grouped: BTreeMap<String, Vec<(String, Tensor)>> = BTreeMap::new();
        for (name, var) in store.variables() {
            if let Some(block) = block_of(&name, lists) {
                grouped.entry(block).or_default().push((name, var));
            }
        }
        if grouped.is_empty() {
            return Err(ModelError::Input(format!("no weights under {lists:?} to shard")));
        }
        let (rank, world) = (group.rank() as i64, group.size() as i64);
        let _guard = tch::no_grad_guard();
        let mut units = BTreeMap::new();
        for (block, mut vars) in grouped {
            vars.sort_by(|a, b| a.0.cmp(&b.0));
            let kinds: Vec<Kind> = vars.iter().map(|(_, v)| v.kind()).collect();
            if kinds.iter().any(|k| *k != kinds[0]) {
                let message = format!("{block} mixes weight kinds {kinds:?}; sharding needs one");
                return Err(ModelError::Input(message));
            }
            let flat =
                Tensor::cat(&vars.iter().map(|(_, v)| v.reshape([-1])).collect::<Vec<_>>(), 0);
            let per_rank = (flat.numel() as i64 + world - 1) / world;
            let start = (rank * per_rank).min(flat.numel() as i64);
            let end = ((rank + 1) * per_rank).min(flat.numel() as i64);
            let shard = Tensor::zeros([per_rank], (flat.kind(), flat.device()));
            shard.narrow(0, 0, end - start).copy_(&flat.narrow(0, start, end - start));
            let params: Vec<(Tensor, Vec<i64>)> = vars
                .into_iter()
                .map(|(_, mut v)| {
                    let shape = v.size();
                    v.set_data(&empty_like(&v));
                    (v, shape)
                })
                .collect();
            units.insert(block, Unit { params, shard });
        }
        Ok(Self { group, units, gathered: RefCell::new(None) })
    }

    /// Makes `block`'s weights whole (dropping the block gathered before, if another); a block
    /// that is not sharded is left alone.
    pub fn gather(&self, block: &str) -> Result<(), ModelError> {
        let Some(unit) = self.units.get(block) else { return Ok(()) };
        if self.gathered.borrow().as_deref() == Some(block) {
            return Ok(());
        }
        self.release();
        let (shard, world) = (&unit.shard, self.group.size() as i64);
        let mut whole =
            Tensor::empty([shard.numel() as i64 * world], (shard.kind(), shard.device()));
        self.group
            .all_gather_into(&mut whole, shard)
            .map_err(|e| ModelError::Input(format!("gathering the weights of {block}: {e}")))?;
        let _guard = tch::no_grad_guard();
        let mut offset = 0;
        for (var, shape) in &unit.params {
            let n: i64 = shape.iter().product();
            var.shallow_clone().set_data(&whole.narrow(0, offset, n).view(shape.as_slice()));
            offset += n;
        }
        *self.gathered.borrow_mut() = Some(block.to_string());
        Ok(())
    }

    /// Drops the gathered block's weights, if any.
    pub fn release(&self) {
        let Some(block) = self.gathered.borrow_mut().take() else { return };
        for (var, _) in &self.units[&block].params {
            var.shallow_clone().set_data(&empty_like(var));
        }
    }

    /// Bytes of block weights this rank keeps between blocks (its slices).
    pub fn shard_bytes(&self) -> i64 {
        self.units
            .values()
            .map(|u| u.shard.numel() as i64 * u.shard.kind().elt_size_in_bytes() as i64)
            .sum()
    }

    /// Bytes of the largest block, gathered.
    pub fn largest_block_bytes(&self) -> i64 {
        let world = self.group.size() as i64;
        self.units
            .values()
            .map(|u| u.shard.numel() as i64 * world * u.shard.kind().elt_size_in_bytes() as i64)
            .max()
            .unwrap_or(0)
    }
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
        assert_eq!(
            block_of("transformer_blocks.12.attn.to_q.weight", &lists).as_deref(),
            Some("transformer_blocks.12")
        );
        assert_eq!(
            block_of("single_transformer_blocks.0.proj_out.bias", &lists).as_deref(),
            Some("single_transformer_blocks.0")
        );
        assert_eq!(block_of("transformer_blocks_extra.1.w", &lists), None);
        assert_eq!(block_of("proj_out.weight", &lists), None);
    }
}
