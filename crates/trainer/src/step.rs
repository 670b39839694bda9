//! One training step's context, handed from the loop to the algorithm: the step's number and
//! learning rate, its metrics and its named timers (`timing_s/<name>` when the step ends, the
//! reference's phases: `gen`, `reward`, `old_log_prob`, `ref`, `teacher`, `adv`, `testing`,
//! `save_checkpoint`).

use std::collections::BTreeMap;
use std::time::Instant;

use flowtune_objectives::Metrics;

/// Training step `number`'s context.
pub struct Step {
    /// The step's number, from 1.
    pub number: u64,
    /// The learning rate of its updates.
    pub lr: f64,
    /// Its metrics, by the reference's names.
    pub metrics: Metrics,
    /// Seconds spent in each named phase.
    pub timers: Timers,
}

impl Step {
    pub fn new(number: u64, lr: f64) -> Self {
        Self { number, lr, metrics: Metrics::new(), timers: Timers::default() }
    }

    /// Its metrics with every timer as `timing_s/<name>`.
    pub fn into_metrics(self) -> Metrics {
        self.timers.snapshot(&self.metrics)
    }
}

/// Seconds by phase name; a phase timed twice adds up.
#[derive(Default)]
pub struct Timers(BTreeMap<&'static str, f64>);

impl Timers {
    /// Runs `f` and adds its seconds to the phase `name`.
    pub fn time<T>(&mut self, name: &'static str, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        self.add(name, start.elapsed().as_secs_f64());
        out
    }

    /// Adds `seconds` to the phase `name` (one timed elsewhere, such as on another thread).
    pub fn add(&mut self, name: &'static str, seconds: f64) {
        *self.0.entry(name).or_default() += seconds;
    }

    /// `metrics` with the timers so far as `timing_s/<name>`.
    pub fn snapshot(&self, metrics: &Metrics) -> Metrics {
        let mut all = metrics.clone();
        all.extend(self.0.iter().map(|(n, s)| (format!("timing_s/{n}"), *s)));
        all
    }

    /// The seconds of the phase `name` so far (0 when it has not run).
    pub fn seconds(&self, name: &str) -> f64 {
        self.0.get(name).copied().unwrap_or(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_add_up_by_name_and_become_timing_metrics() {
        let mut step = Step::new(3, 1e-4);
        let got = step.timers.time("adv", || 7);
        step.timers.add("adv", 1.0);
        step.timers.add("gen", 2.5);
        step.metrics.insert("actor/lr".into(), 1e-4);
        assert_eq!(got, 7);
        let adv = step.timers.seconds("adv");
        assert!(adv >= 1.0, "{adv}");
        let m = step.into_metrics();
        assert_eq!(m["timing_s/gen"], 2.5);
        assert_eq!(m["timing_s/adv"], adv);
        assert_eq!(m.len(), 3);
    }
}
