//! `rollout.batch_size: auto` and `trainer.micro_batch_size: auto`: sizes left to the planner.
//! The recipe loads with a stand-in for each (all of a rank's rows; one prompt group, which every
//! algorithm takes), and the caller that knows the device's memory sets the largest that fit
//! before anything loads.

use flowtune_sampling::SamplerConfig;
use serde_yaml::Value;

/// The keys that take `auto`.
const KEYS: [[&str; 2]; 2] = [["rollout", "batch_size"], ["trainer", "micro_batch_size"]];

/// Which sizes the recipe leaves to the planner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AutoSizes {
    /// `rollout.batch_size: auto`.
    pub rollout_batch: bool,
    /// `trainer.micro_batch_size: auto`.
    pub micro_batch: bool,
}

impl AutoSizes {
    /// Whether any size is left to the planner.
    pub fn any(self) -> bool {
        self.rollout_batch || self.micro_batch
    }

    /// Takes the `auto` values out of the recipe tree `tree`, leaving the stand-ins `0` (all rows)
    /// and `rollout.n`, and says which there were.
    pub(crate) fn take(tree: &mut Value) -> Self {
        let group = tree.get("rollout").and_then(|r| r.get("n")).and_then(Value::as_u64);
        let group = group.unwrap_or(SamplerConfig::default().n as u64);
        let mut found = [false; 2];
        for (slot, [section, key]) in found.iter_mut().zip(KEYS) {
            let Some(value) = tree.get_mut(section).and_then(|s| s.get_mut(key)) else { continue };
            if value.as_str() == Some("auto") {
                *value = Value::from(if key == "batch_size" { 0 } else { group });
                *slot = true;
            }
        }
        Self { rollout_batch: found[0], micro_batch: found[1] }
    }

    /// Writes `auto` back into the resolved tree `tree` where a size is still left open.
    pub(crate) fn mark(self, tree: &mut Value) {
        for (open, [section, key]) in [self.rollout_batch, self.micro_batch].into_iter().zip(KEYS) {
            if let (true, Some(value)) = (open, tree.get_mut(section).and_then(|s| s.get_mut(key)))
            {
                *value = Value::from("auto");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_values_leave_stand_ins_and_come_back_when_shown() {
        let mut tree: Value = serde_yaml::from_str(
            "rollout: {batch_size: auto, n: 4}\ntrainer: {micro_batch_size: 8}",
        )
        .unwrap();
        let auto = AutoSizes::take(&mut tree);
        assert_eq!(auto, AutoSizes { rollout_batch: true, micro_batch: false });
        assert_eq!(tree["rollout"]["batch_size"], Value::from(0));
        assert_eq!(tree["trainer"]["micro_batch_size"], Value::from(8));
        let mut micro: Value = serde_yaml::from_str("trainer: {micro_batch_size: auto}").unwrap();
        assert!(AutoSizes::take(&mut micro).micro_batch);
        let n = SamplerConfig::default().n as u64;
        assert_eq!(micro["trainer"]["micro_batch_size"], Value::from(n));
        auto.mark(&mut tree);
        assert_eq!(tree["rollout"]["batch_size"], Value::from("auto"));
        assert!(!AutoSizes::take(&mut Value::Null).any());
    }
}
