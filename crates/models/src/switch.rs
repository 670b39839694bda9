//! A shared on/off switch: every adapter of a model, or its fused projections, at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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
