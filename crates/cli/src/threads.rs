//! How many CPU threads tensor work uses. libtorch's default, one OpenMP worker per core, makes
//! every one of a step's thousands of small parallel regions wait for all workers: when anything
//! else holds a core (a reward on CPU threads beside the rollout, another program) a worker that
//! lost its core stalls each region for a time slice, and a step slows severalfold. flowtune
//! therefore leaves one core to the rest of the machine unless told otherwise.

/// Sets libtorch's intra-op threads: `requested` (`--threads`), else `OMP_NUM_THREADS` when set
/// (libtorch has read it already), else one less than the cores this process may use (at least
/// one). Returns the count in effect.
pub fn configure(requested: Option<usize>) -> usize {
    let from_env = std::env::var("OMP_NUM_THREADS").ok().and_then(|v| v.parse::<usize>().ok());
    let threads = requested.or(from_env).unwrap_or_else(|| default_threads(cores()));
    tch::set_num_threads(threads.max(1) as i32);
    threads.max(1)
}

/// The cores this process may run on (its affinity mask or cgroup quota, as the standard
/// library reads them).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// One core less than `cores`, at least one: the core left over runs the reward worker, the data
/// loader and whatever else the machine is doing.
fn default_threads(cores: usize) -> usize {
    cores.saturating_sub(1).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_core_is_left_over_and_never_the_last() {
        assert_eq!([1, 2, 3, 16].map(default_threads), [1, 1, 2, 15]);
    }
}
