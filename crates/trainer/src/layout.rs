//! How the trained model is spread over the ranks, as the build's parallelize step laid it
//! out: what the update, validation and the step's metrics read instead of asking the recipe.

/// The model's layout over the ranks.
#[derive(Debug, Clone, Copy, Default)]
pub struct Layout {
    /// The blocks' weights are split over the ranks and gathered by all of them together, block
    /// by block, so every rank runs as many forward and backward passes.
    pub sharded_blocks: bool,
    /// Bytes of this rank's slices of the sharded blocks, and of one gathered block.
    pub sharded_bytes: Option<(i64, i64)>,
}
