//! Intra-op CPU threads from the work's size. A forward of a small model on a small batch runs
//! thousands of parallel regions too small to split: waking the other threads for each costs more
//! than it saves (a tiny SD3 step is about a quarter faster on one thread than on two). When the
//! user has not fixed the count (`--threads`, `OMP_NUM_THREADS`), a CPU run takes one thread per
//! [`WORK_PER_THREAD`] multiply-adds of a denoiser forward, at least one and at most libtorch's
//! count. The choice depends on the recipe and the model alone, so a run and its resume make the
//! same one.

use std::sync::atomic::{AtomicBool, Ordering};

/// Multiply-adds of one denoiser forward per thread worth waking.
pub const WORK_PER_THREAD: f64 = 1e9;

/// Set when the user fixed the thread count.
static FIXED: AtomicBool = AtomicBool::new(false);

/// Says that the user fixed the thread count (`--threads`): runs keep it.
pub fn fixed_by_user() {
    FIXED.store(true, Ordering::Relaxed);
}

/// Whether the thread count is the user's (`--threads`, or `OMP_NUM_THREADS`).
pub fn fixed() -> bool {
    FIXED.load(Ordering::Relaxed) || std::env::var_os("OMP_NUM_THREADS").is_some()
}

/// Threads for `work` multiply-adds a forward with `available` threads.
pub fn for_work(work: f64, available: usize) -> usize {
    ((work / WORK_PER_THREAD).ceil() as usize).clamp(1, available.max(1))
}

/// Sets the intra-op threads of a CPU run from a forward of `params` weights over `rows` samples
/// of `tokens` tokens each, unless the user fixed them; returns the line that says so when it
/// changed them.
pub(crate) fn fit(params: f64, rows: f64, tokens: f64) -> Option<String> {
    if fixed() {
        return None;
    }
    let available = tch::get_num_threads().max(1) as usize;
    let work = params * rows * tokens;
    let threads = for_work(work, available);
    if threads == available {
        return None;
    }
    tch::set_num_threads(threads as i32);
    Some(format!(
        "threads: {threads} of {available} (a denoiser forward is about {work:.1e} multiply-adds, \
         {WORK_PER_THREAD:.0e} a thread; --threads sets them)"
    ))
}

#[cfg(test)]
mod tests {
    use super::for_work;

    #[test]
    fn small_work_takes_fewer_threads() {
        assert_eq!(for_work(8e5, 2), 1);
        assert_eq!(for_work(1.5e9, 2), 2);
        assert_eq!(for_work(3.3e10, 16), 16);
        assert_eq!(for_work(3.3e10, 64), 33);
        assert_eq!(for_work(0.0, 8), 1);
    }
}
