//! CPU threads for tensor work, and how they wait. A shapes-demo step runs thousands of small
//! OpenMP parallel regions; libgomp's workers spin between them by default. When anything else
//! holds a core (a reward on CPU threads beside the rollout, another program), a spinning worker
//! keeps the one that lost its core from running, and every region stalls for a time slice: on a
//! 2-core machine one busy core made a step 3.2× slower. Workers that sleep at once instead cost
//! a quiet demo step about a fifth more and leave a loaded one near one thread's pace
//! (docs/perf/README.md, "CPU threads beside other work").

use std::os::unix::process::CommandExt;

/// What libgomp reads when it loads (before `main`): the wait policy and the spin count.
const WAIT_VARIABLES: [&str; 2] = ["OMP_WAIT_POLICY", "GOMP_SPINCOUNT"];

/// Makes OpenMP workers sleep between regions (`OMP_WAIT_POLICY=PASSIVE`) unless the
/// environment already says how they wait. libgomp reads this only when it loads, so the process
/// re-executes itself once with the variable set; returns only when no re-execution is needed
/// (or it failed, which leaves the default policy).
pub fn passive_wait() {
    if WAIT_VARIABLES.iter().any(|v| std::env::var_os(v).is_some()) {
        return;
    }
    let Ok(exe) = std::env::current_exe() else { return };
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let error = std::process::Command::new(exe).args(args).env(WAIT_VARIABLES[0], "PASSIVE").exec();
    eprintln!("warning: could not re-execute with OMP_WAIT_POLICY=PASSIVE ({error}); continuing");
}

/// Sets libtorch's intra-op threads to `requested` (`--threads`); without it libtorch keeps its
/// own choice (`OMP_NUM_THREADS`, else one per core).
pub fn configure(requested: Option<usize>) {
    if let Some(n) = requested {
        tch::set_num_threads(n as i32);
        flowtune_trainer::threads::fixed_by_user();
    }
}

/// `--threads N`: a count of at least one.
pub fn parse(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("expected a number of threads of at least 1, got {text:?}")),
    }
}
