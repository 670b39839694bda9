//! `flowtune launch --nproc N -- train RECIPE …`: one process per device on this machine, joined
//! as torchrun would join them (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//! MASTER_PORT). For several machines use torchrun or Slurm (see the README).

use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use clap::Args;

use crate::device::DeviceArg;
use crate::Failure;

/// How long the other ranks get to stop on their own (and say why) after one has failed.
const GRACE: Duration = Duration::from_secs(15);

#[derive(Args)]
pub struct LaunchArgs {
    /// Processes to start (one per GPU for a CUDA run).
    #[arg(long)]
    nproc: usize,
    /// The rendezvous port on 127.0.0.1 (default: a free one).
    #[arg(long)]
    master_port: Option<u16>,
    /// The flowtune command every process runs, after `--` (e.g. `-- train recipe.yaml`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub fn run(args: LaunchArgs, device: Option<DeviceArg>) -> Result<(), Failure> {
    if args.nproc == 0 {
        return Err(Failure::input(anyhow!("--nproc must be at least 1")));
    }
    // The launcher's `--device` goes to every rank, which computes on its LOCAL_RANK's GPU.
    let passed = device.map(|d| crate::device::name(d.0));
    let inner = args.command.iter().enumerate().find_map(|(i, a)| match a.as_str() {
        "--device" => args.command.get(i + 1).cloned(),
        _ => a.strip_prefix("--device=").map(String::from),
    });
    if let (Some(outer), Some(inner)) = (&passed, &inner) {
        let same = crate::device::parse(inner).is_ok_and(|d| crate::device::name(d.0) == *outer);
        if !same {
            return Err(Failure::input(anyhow!(
                "launch --device {outer} and the command's --device {inner} differ; name it once"
            )));
        }
    }
    let device_args = match (&passed, &inner) {
        (Some(outer), None) => vec!["--device".to_string(), outer.clone()],
        _ => vec![],
    };
    let port = match args.master_port {
        Some(p) => p,
        None => free_port().map_err(Failure::Runtime)?,
    };
    let exe = std::env::current_exe()
        .context("locating the flowtune binary")
        .map_err(Failure::Runtime)?;
    let threads = std::env::var("OMP_NUM_THREADS").ok().unwrap_or_else(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / args.nproc).max(1).to_string()
    });
    let mut children = vec![];
    for rank in 0..args.nproc {
        let child = Command::new(&exe)
            .args(&device_args)
            .args(&args.command)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", args.nproc.to_string())
            .env("LOCAL_WORLD_SIZE", args.nproc.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("OMP_NUM_THREADS", &threads)
            .spawn()
            .with_context(|| format!("starting rank {rank} ({})", exe.display()))
            .map_err(Failure::Runtime)?;
        children.push(Some(child));
    }
    forward_signals(children.iter().flatten().map(Child::id).collect());
    match wait_all(&mut children).map_err(Failure::Runtime)? {
        None => Ok(()),
        Some((rank, status)) => Err(Failure::Runtime(anyhow!(
            "rank {rank} of {} failed ({status}); the job stopped",
            args.nproc
        ))),
    }
}

/// Passes SIGTERM and SIGUSR1 (a scheduler's stop, or `kill`) on to every rank, which finishes
/// its step, saves and stops; the launcher outlives Ctrl-C, which the terminal sends to every rank
/// itself, and waits for them.
fn forward_signals(ranks: Vec<u32>) {
    use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGUSR1]) else {
        return;
    };
    std::thread::spawn(move || {
        for s in signals.forever().filter(|s| *s != SIGINT) {
            for &pid in &ranks {
                // SAFETY: kill(2) with a child's pid and a signal number; a rank that has ended
                // and been waited for makes it fail harmlessly (ESRCH) or, at worst, a reused pid
                // of this user gets a catchable signal.
                unsafe { libc::kill(pid as libc::pid_t, s) };
            }
        }
    });
}

/// A port on 127.0.0.1 that nothing listens on now.
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// Waits for every rank; after the first failure the others get [`GRACE`] to stop on their own,
/// then are killed. Returns the first failed rank and its status, if any.
fn wait_all(children: &mut [Option<Child>]) -> anyhow::Result<Option<(usize, ExitStatus)>> {
    let mut failed: Option<(usize, ExitStatus, Instant)> = None;
    while children.iter().any(Option::is_some) {
        for (rank, slot) in children.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            if let Some(status) = child.try_wait()? {
                *slot = None;
                if !status.success() && failed.is_none() {
                    failed = Some((rank, status, Instant::now()));
                }
            }
        }
        if let Some((_, _, at)) = failed {
            if at.elapsed() > GRACE {
                for child in children.iter_mut().flatten() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(failed.map(|(rank, status, _)| (rank, status)))
}
