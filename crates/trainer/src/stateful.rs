//! The parts of a run that checkpoint themselves — the optimizer, each copy of the weights (EMA,
//! old policy, anchor), the data source and the algorithm — each giving and taking back its own
//! state, so the checkpoint code reads no part's fields and a new part's state never touches it.

use std::collections::{BTreeMap, BTreeSet};

use tch::Tensor;

use crate::TrainError;

/// What a part sees while it saves or restores its tensors.
pub struct Scope<'a> {
    /// The trained parameters, by name (a copy a checkpoint lacks starts at them).
    pub params: &'a BTreeMap<String, Tensor>,
    /// The parameters that are this rank's slices of sharded blocks: saved block by block,
    /// gathered from every rank, never by the parts.
    pub sliced: &'a BTreeSet<String>,
}

/// A part of a run whose state a checkpoint keeps: a small JSON value in `state.json` and named
/// tensors in the checkpoint's tensor files (each name under the part's own prefix).
pub trait Stateful {
    /// What it keeps in `state.json` (`null`: nothing).
    fn state(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// Takes back what [`Self::state`] gave (`null` from a checkpoint that has none).
    fn restore(&mut self, _state: &serde_json::Value) -> Result<(), TrainError> {
        Ok(())
    }

    /// Its tensors by checkpoint name, but those of `scope.sliced`.
    fn state_tensors(&self, _scope: &Scope<'_>) -> Vec<(String, Tensor)> {
        vec![]
    }

    /// Copies its tensors back in place from `saved` (every tensor file of the checkpoint
    /// together); the error names the first one missing.
    fn load_state_tensors(
        &self,
        _saved: &BTreeMap<String, Tensor>,
        _scope: &Scope<'_>,
    ) -> Result<(), String> {
        Ok(())
    }
}
