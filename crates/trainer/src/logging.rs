//! What a run tells people as it goes: metric lines (JSONL and TensorBoard) and one-line summaries
//! above the progress bar.

use std::io::Write;
use std::path::Path;

use flowtune_objectives::Metrics;

use crate::tensorboard::EventWriter;
use crate::TrainError;

/// Step `k`'s metrics into `metrics.jsonl` and the TensorBoard events.
pub(crate) struct MetricLog {
    path: std::path::PathBuf,
    file: std::fs::File,
    events: EventWriter,
}

impl MetricLog {
    /// Opens `out_dir/metrics.jsonl` (dropping lines of steps after `resumed_at`, logged after the
    /// checkpoint a run resumes from, and restoring that checkpoint's own line `saved` when the
    /// killed run never wrote it) and a TensorBoard writer under `out_dir/tensorboard`.
    pub fn open(
        out_dir: &Path,
        resumed_at: u64,
        saved: &serde_json::Value,
    ) -> Result<Self, TrainError> {
        let path = out_dir.join("metrics.jsonl");
        keep_metrics_up_to(&path, resumed_at, saved)?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| TrainError::io(&path, e))?;
        let events = EventWriter::create(&out_dir.join("tensorboard"))?;
        Ok(Self { path, file, events })
    }

    /// Appends step `k`'s metrics.
    pub fn log(&mut self, k: u64, m: &Metrics) -> Result<(), TrainError> {
        writeln!(self.file, "{}", metric_line(k, m)).map_err(|e| TrainError::io(&self.path, e))?;
        self.events.scalars(k, m)
    }
}

/// Step `k`'s line of `metrics.jsonl`.
pub(crate) fn metric_line(k: u64, m: &Metrics) -> serde_json::Value {
    let mut line = serde_json::Map::new();
    line.insert("step".into(), k.into());
    for (key, v) in m {
        line.insert(key.clone(), serde_json::json!(v));
    }
    serde_json::Value::Object(line)
}

/// Drops the lines of steps after `step`; appends `saved` (step `step`'s line) when that step has
/// none.
fn keep_metrics_up_to(path: &Path, step: u64, saved: &serde_json::Value) -> Result<(), TrainError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(TrainError::io(path, e)),
    };
    let mut has_step = false;
    let mut kept = String::new();
    for line in text.lines() {
        let at =
            serde_json::from_str::<serde_json::Value>(line).ok().and_then(|v| v["step"].as_u64());
        if at.is_some_and(|s| s <= step) {
            has_step |= at == Some(step);
            kept.push_str(line);
            kept.push('\n');
        }
    }
    if !has_step && saved["step"].as_u64() == Some(step) {
        kept.push_str(&format!("{saved}\n"));
    }
    std::fs::write(path, kept).map_err(|e| TrainError::io(path, e))
}

/// The progress bar of a run of `total` steps, starting at `start`.
pub(crate) fn progress_bar(total: u64, start: u64) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(total).with_position(start);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} step {pos}/{len} [{bar:30}] {elapsed_precise} (eta {eta}) {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar
}

/// The per-step line: the reward when there is one, the loss and the algorithm's telltales.
pub(crate) fn step_line(k: u64, total: u64, m: &Metrics, seconds: f64) -> String {
    let mut line = format!("step {k}/{total}");
    for (key, label) in [
        ("critic/rewards/mean", "reward"),
        ("actor/loss", "loss"),
        ("actor/pg_clipfrac", "clipfrac"),
        ("actor/ppo_kl", "kl"),
        ("actor/implicit_acc", "implicit_acc"),
        ("actor/kl_loss", "kl_loss"),
    ] {
        if let Some(v) = m.get(key) {
            let v =
                if v.abs() < 1e-2 && *v != 0.0 { format!("{v:.2e}") } else { format!("{v:.4}") };
            line.push_str(&format!("  {label} {v}"));
        }
    }
    line + &format!("  {seconds:.1}s")
}

/// Prints a line above the progress bar; without a terminal (bar hidden) to stderr as it is.
pub(crate) fn say(bar: &indicatif::ProgressBar, line: String) {
    if bar.is_hidden() {
        self::line(&line);
    } else {
        bar.println(line);
    }
}

/// Writes `text` and its newline to stderr in one write, so that the lines of ranks sharing one
/// stderr never interleave mid-line (`eprintln!` writes the newline apart).
pub(crate) fn line(text: &str) {
    let _ = std::io::stderr().lock().write_all(format!("{text}\n").as_bytes());
}

/// The validation metrics as `name value` pairs on one line.
pub(crate) fn summary_line(m: &Metrics) -> String {
    m.iter()
        .filter(|(k, _)| k.starts_with("val-core/"))
        .map(|(k, v)| format!("{} {v:.4}", k.trim_start_matches("val-core/")))
        .collect::<Vec<_>>()
        .join("  ")
}

/// Min, max and mean of `values` under `prefix/`.
pub(crate) fn stats(prefix: &str, values: &[f64], out: &mut Metrics) {
    let n = values.len().max(1) as f64;
    out.insert(format!("{prefix}/mean"), values.iter().sum::<f64>() / n);
    out.insert(format!("{prefix}/max"), values.iter().cloned().fold(f64::NEG_INFINITY, f64::max));
    out.insert(format!("{prefix}/min"), values.iter().cloned().fold(f64::INFINITY, f64::min));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(path: &Path) -> Vec<u64> {
        let text = std::fs::read_to_string(path).unwrap();
        text.lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].as_u64().unwrap()
            })
            .collect()
    }

    /// A run killed after saving step 2's checkpoint but before logging step 2 gets that line back
    /// from the checkpoint; a line already there is kept as written, later ones are dropped.
    #[test]
    fn resuming_restores_the_checkpoint_step_line_and_drops_later_ones() {
        let dir = flowtune_fixtures::scratch("log");
        let path = dir.join("metrics.jsonl");
        let m = |v: f64| Metrics::from([("critic/rewards/mean".to_string(), v)]);
        let lines = [metric_line(1, &m(0.1)), metric_line(3, &m(0.3))];
        std::fs::write(&path, lines.map(|l| format!("{l}\n")).concat()).unwrap();
        keep_metrics_up_to(&path, 2, &metric_line(2, &m(0.2))).unwrap();
        assert_eq!(steps(&path), [1, 2]);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.lines().nth(1).unwrap().contains("0.2"));

        keep_metrics_up_to(&path, 2, &metric_line(2, &m(0.9))).unwrap();
        assert_eq!(steps(&path), [1, 2]);
        assert!(!std::fs::read_to_string(&path).unwrap().contains("0.9"), "the logged line stays");
        // An old checkpoint without a saved line restores nothing.
        keep_metrics_up_to(&path, 1, &serde_json::Value::Null).unwrap();
        assert_eq!(steps(&path), [1]);
    }
}
