//! Laying the model out over the ranks: every sample's tokens over a sequence-parallel group and
//! the blocks' weights over the job (`trainer.sharding`), for the trained model and a frozen
//! reference copy alike.

use std::sync::Arc;

use flowtune_config::{Recipe, Sharding, StateOffload};
use flowtune_dist::{ProcessGroup, ReduceOp};
use flowtune_models::sequence::{SequenceGroup, SequenceParallel};
use flowtune_models::shard::{Alone, ShardGroup, ShardMode};
use flowtune_models::{ModelError, TrainableDenoiser};
use tch::Tensor;

use super::Comm;
use crate::reference::Reference;
use crate::TrainError;

impl Comm {
    /// Whether this job shards the transformer blocks (`trainer.sharding: frozen` or `full`
    /// over several ranks, or in one process whose slices live on the host, `trainer.offload:
    /// all`, so that its device holds one block at a time); never on a rollout rank.
    pub fn shards_blocks(&self, recipe: &Recipe) -> bool {
        let on_host = recipe.trainer.offload == StateOffload::All;
        // Rollout ranks sample with whole weights.
        !self.is_rollout()
            && (self.size() > 1 || on_host)
            && matches!(recipe.sharding(), Sharding::Frozen | Sharding::Full)
    }

    /// Splits the denoiser (and a frozen reference copy) over the ranks as the recipe says: every
    /// sample's tokens over this rank's sequence-parallel group, and when this job shards the
    /// blocks, this rank's share of the block weights only.
    pub(crate) fn shard_blocks(
        &self,
        recipe: &Recipe,
        denoiser: &dyn TrainableDenoiser,
        reference: Option<&Reference>,
    ) -> Result<(), TrainError> {
        if let Some(sequence) = &self.sequence {
            let split = |model: &dyn TrainableDenoiser| {
                let ranks = SequenceParallel(Arc::new(SequenceRanks(sequence.clone())));
                model.sequence_parallel(ranks).map_err(|e| {
                    TrainError::Invalid(format!(
                        "{} (trainer.sequence_parallel_size): {e}",
                        model.describe()
                    ))
                })
            };
            split(denoiser)?;
            if let Some(Reference::Frozen(copy)) = reference {
                split(copy.as_ref())?;
            }
        }
        if !self.shards_blocks(recipe) {
            return Ok(());
        }
        let group: Arc<dyn ShardGroup> = match &self.group {
            Some(group) => Arc::new(BlockGroup(group.clone())),
            None => Arc::new(Alone),
        };
        let mode = match recipe.sharding() {
            Sharding::Full => ShardMode::Full { exact: recipe.trainer.exact_gradient_sum },
            _ => ShardMode::Frozen,
        };
        let on_host = recipe.trainer.offload == StateOffload::All;
        denoiser.shard_blocks(group.clone(), mode, on_host)?;
        if let Some(Reference::Frozen(copy)) = reference {
            copy.shard_blocks(group, ShardMode::Frozen, false)?;
        }
        Ok(())
    }
}

/// The job's process group as sharded blocks see it.
struct BlockGroup(Arc<ProcessGroup>);

impl ShardGroup for BlockGroup {
    fn rank(&self) -> usize {
        self.0.rank()
    }

    fn size(&self) -> usize {
        self.0.size()
    }

    fn all_gather_into(&self, out: &mut Tensor, shard: &Tensor) -> Result<(), String> {
        self.0.all_gather_into(out, shard).map_err(|e| e.to_string())
    }

    fn reduce_scatter_into(&self, out: &mut Tensor, full: &Tensor) -> Result<(), String> {
        self.0.reduce_scatter_into(out, full, ReduceOp::Sum).map_err(|e| e.to_string())
    }
}

/// A sequence-parallel group as the model's attention sees it.
struct SequenceRanks(Arc<ProcessGroup>);

impl SequenceGroup for SequenceRanks {
    fn rank(&self) -> usize {
        self.0.rank()
    }

    fn size(&self) -> usize {
        self.0.size()
    }

    fn exchange(&self, x: &Tensor, scatter: i64, gather: i64) -> Result<Tensor, ModelError> {
        let failed = |e| ModelError::Collective(format!("sequence-parallel attention: {e}"));
        self.0.exchange(x, scatter, gather).map_err(failed)
    }

    fn all_gather(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        let mut shape = x.size();
        shape[0] *= self.0.size() as i64;
        let mut out = Tensor::zeros(&shape, (x.kind(), x.device()));
        self.0.all_gather_into(&mut out, x).map_err(|e| ModelError::Collective(e.to_string()))?;
        Ok(out)
    }
}
