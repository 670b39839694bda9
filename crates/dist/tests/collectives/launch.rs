//! Spawns ranks as re-executions of this test binary (filtered to `worker_process`), with their
//! output in files that are shown only when a rank fails.
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The variable that turns `worker_process` into a rank running the named scenario.
pub const SCENARIO: &str = "FLOWTUNE_DIST_SCENARIO";

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The arguments that make this test binary run only `worker_process`.
pub fn worker_args() -> [&'static str; 4] {
    ["worker_process", "--exact", "--nocapture", "--test-threads=1"]
}

/// A spawned process whose stdout and stderr go to a file.
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd` (with `GLOO_SOCKET_IFNAME=lo` and the scenario) as `name`.
    pub fn spawn(name: &str, mut cmd: Command, scenario: &str) -> Proc {
        let log =
            std::env::temp_dir().join(format!("flowtune-dist-{}-{name}.log", std::process::id()));
        let file = std::fs::File::create(&log).unwrap();
        cmd.env(SCENARIO, scenario).env("GLOO_SOCKET_IFNAME", "lo").stdin(Stdio::null());
        cmd.stdout(file.try_clone().unwrap()).stderr(file);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Proc { name: name.to_owned(), child, log }
    }

    /// A rank of this test binary, with torchrun-style variables.
    pub fn rank(scenario: &str, rank: usize, world: usize, port: u16) -> Proc {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(worker_args());
        for (var, value) in [
            ("RANK", rank),
            ("WORLD_SIZE", world),
            ("LOCAL_RANK", rank),
            ("LOCAL_WORLD_SIZE", world),
        ] {
            cmd.env(var, value.to_string());
        }
        cmd.env("MASTER_ADDR", "127.0.0.1").env("MASTER_PORT", port.to_string());
        Proc::spawn(&format!("rank{rank}-{port}"), cmd, scenario)
    }
}

/// Waits for every process (killing all of them after `limit`) and panics, showing their output,
/// unless all exited successfully.
pub fn expect_success(mut procs: Vec<Proc>, limit: Duration) {
    let start = Instant::now();
    let mut codes = vec![None; procs.len()];
    while codes.iter().any(Option::is_none) && start.elapsed() < limit {
        for (p, code) in procs.iter_mut().zip(&mut codes) {
            if code.is_none() {
                *code = p.child.try_wait().unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut report = String::new();
    for (p, code) in procs.iter_mut().zip(&codes) {
        if code.is_none() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        let output = std::fs::read_to_string(&p.log).unwrap_or_default();
        let _ = std::fs::remove_file(&p.log);
        if !code.is_some_and(|c| c.success()) {
            let status =
                code.map_or(format!("still running after {limit:?}, killed"), |c| c.to_string());
            report.push_str(&format!("--- {} ({status}):\n{output}\n", p.name));
        }
    }
    assert!(report.is_empty(), "worker processes failed:\n{report}");
}
