//! Stopping a run cleanly: SIGTERM and SIGUSR1 (what Slurm sends before preemption or the time
//! limit, with `--signal`) and the first Ctrl-C ask the run to finish its step, save a checkpoint
//! and stop; a second Ctrl-C aborts at once (the newest complete checkpoint stays loadable).

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::{Handle, Signals};

/// The signal that asked this run to stop, if one did; the handlers go when it is dropped.
pub(crate) struct StopRequest {
    signal: Arc<AtomicI32>,
    handle: Option<Handle>,
    watcher: Option<std::thread::JoinHandle<()>>,
}

/// A signal's name, as people write it.
pub(crate) fn name(signal: i32) -> &'static str {
    match signal {
        SIGINT => "Ctrl-C (SIGINT)",
        SIGTERM => "SIGTERM",
        SIGUSR1 => "SIGUSR1",
        _ => "a signal",
    }
}

impl StopRequest {
    /// Listens for the stopping signals; with `announce` (one rank of a job), says what the first
    /// one will do. Without handlers (they could not be installed) the run cannot be asked to stop.
    pub(crate) fn listen(announce: bool) -> Self {
        let signal = Arc::new(AtomicI32::new(0));
        let Ok(mut signals) = Signals::new([SIGINT, SIGTERM, SIGUSR1]) else {
            return Self { signal, handle: None, watcher: None };
        };
        let (seen, handle) = (signal.clone(), signals.handle());
        let watcher = std::thread::spawn(move || {
            for s in signals.forever() {
                let first = seen.load(Ordering::SeqCst);
                if s == SIGINT && first == SIGINT {
                    eprintln!("second Ctrl-C: aborting now; the newest complete checkpoint stays");
                    std::process::exit(130);
                }
                if first == 0 {
                    seen.store(s, Ordering::SeqCst);
                    let again = if s == SIGINT { " (Ctrl-C again aborts at once)" } else { "" };
                    if announce {
                        eprintln!(
                            "{}: finishing this step, then saving a checkpoint and stopping{again}",
                            name(s)
                        );
                    }
                }
            }
        });
        Self { signal, handle: Some(handle), watcher: Some(watcher) }
    }

    /// The signal received, if any.
    pub(crate) fn received(&self) -> Option<i32> {
        Some(self.signal.load(Ordering::SeqCst)).filter(|s| *s != 0)
    }
}

impl Drop for StopRequest {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            handle.close();
        }
        if let Some(watcher) = self.watcher.take() {
            let _ = watcher.join();
        }
    }
}
