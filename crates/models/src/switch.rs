//! A shared on/off switch: every adapter of a model, or its fused projections, at once; and the
//! fused projections' record of which weights lie together.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// On when made; its clones share the state.
#[derive(Debug, Clone)]
pub struct Switch(Arc<AtomicBool>);

impl Default for Switch {
    fn default() -> Self {
        Self(Arc::new(AtomicBool::new(true)))
    }
}

impl Switch {
    pub fn enabled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }
}

/// Whether a model's layers built together run as one GEMM ([`crate::nn::project`]), and which
/// of its variables lie together, as rows of one tensor, in order (weights, biases): what
/// [`crate::shard::ShardedBlocks`] keeps together when it gathers a block.
#[derive(Debug, Clone, Default)]
pub struct Fusing {
    pub switch: Switch,
    groups: Arc<Mutex<Vec<Vec<String>>>>,
}

impl Fusing {
    /// Records variables `names` as lying together, in this order.
    pub fn record(&self, names: Vec<String>) {
        self.groups.lock().unwrap_or_else(|e| e.into_inner()).push(names);
    }

    /// Every group recorded.
    pub fn groups(&self) -> Vec<Vec<String>> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
