//! ProcessGroup over Gloo on loopback: 2 spawned ranks, the all-to-all over 2 and 4, a dead and a hung peer, torchrun, world size 1, and
//! NCCL refused without a GPU.
#[path = "collectives/launch.rs"]
mod launch;
#[path = "collectives/worker.rs"]
mod worker;

use flowtune_dist::{Backend, DistEnv, DistError, ProcessGroup, ReduceOp};
use launch::{expect_success, free_port, worker_args, Proc, SCENARIO};
use std::process::Command;
use std::time::Duration;
use tch::{Kind, Tensor};

/// Not a test of its own: the entry point of the ranks the other tests spawn (a no-op otherwise).
#[test]
fn worker_process() {
    if let Ok(scenario) = std::env::var(SCENARIO) {
        worker::run(&scenario);
    }
}

#[test]
fn two_ranks_over_gloo() {
    let port = free_port();
    let ranks = (0..2).map(|r| Proc::rank("collectives", r, 2, port)).collect();
    expect_success(ranks, Duration::from_secs(120));
}

#[test]
fn all_to_all_over_two_and_four_ranks_is_bit_identical_to_gathering() {
    for world in [2, 4] {
        let port = free_port();
        let ranks = (0..world).map(|r| Proc::rank("all_to_all", r, world, port)).collect();
        expect_success(ranks, Duration::from_secs(120));
    }
}

#[test]
fn a_dead_peer_fails_the_next_collective_within_the_timeout() {
    let port = free_port();
    let ranks = (0..2).map(|r| Proc::rank("dead_peer", r, 2, port)).collect();
    expect_success(ranks, Duration::from_secs(60));
}

#[test]
fn a_hung_peer_times_out_the_collective() {
    let port = free_port();
    let ranks = (0..2).map(|r| Proc::rank("hung_peer", r, 2, port)).collect();
    expect_success(ranks, Duration::from_secs(60));
}

#[test]
fn two_ranks_under_torchrun() {
    let venv = std::env::var("FLOWTUNE_VENV").unwrap_or_default();
    let torchrun = std::path::Path::new(&venv).join("bin/torchrun");
    if !torchrun.exists() {
        println!("skipped: no torchrun at {} (set FLOWTUNE_VENV)", torchrun.display());
        return;
    }
    let mut cmd = Command::new(torchrun);
    cmd.args(["--standalone", "--nproc-per-node", "2", "--no-python"]);
    cmd.arg(std::env::current_exe().unwrap()).args(worker_args());
    for var in
        ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
    {
        cmd.env_remove(var);
    }
    expect_success(vec![Proc::spawn("torchrun", cmd, "torchrun")], Duration::from_secs(180));
}

#[test]
fn world_size_one_collectives_are_identities() {
    let env = DistEnv { master_port: free_port(), ..solo() };
    let pg = ProcessGroup::new(&env, Backend::Gloo, Duration::from_secs(30)).unwrap();
    let x = Tensor::from_slice(&[1.5f32, -2.0, 4.0]);
    for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min] {
        let mut t = x.copy();
        pg.all_reduce_(&mut t, op).unwrap();
        assert_eq!(t, x, "{op:?}");
    }
    let mut t = x.copy();
    pg.broadcast_(&mut t, 0).unwrap();
    assert_eq!(t, x);
    let mut out = Tensor::zeros([3], (Kind::Float, tch::Device::Cpu));
    pg.all_gather_into(&mut out, &x).unwrap();
    assert_eq!(out, x);
    let mut out = Tensor::zeros([3], (Kind::Float, tch::Device::Cpu));
    pg.reduce_scatter_into(&mut out, &x, ReduceOp::Sum).unwrap();
    assert_eq!(out, x);
    pg.barrier().unwrap();
    assert_eq!(pg.all_gather_bytes(b"solo").unwrap(), [b"solo".to_vec()]);
}

/// Without a GPU, NCCL is refused with a clear error; with one, a world of one runs on GPU 0.
#[test]
fn nccl_is_refused_without_a_gpu_and_runs_with_one() {
    let env = DistEnv { master_port: free_port(), ..solo() };
    let result = ProcessGroup::new(&env, Backend::Nccl, Duration::from_secs(30));
    if tch::Cuda::device_count() == 0 {
        let err = result.err().expect("NCCL is refused without a GPU");
        assert!(matches!(err, DistError::NoGpu), "{err}");
        assert!(err.to_string().contains("no GPU"), "{err}");
        return;
    }
    let pg = result.unwrap();
    let x = Tensor::from_slice(&[1.5f32, -2.0]).to_device(tch::Device::Cuda(0));
    let mut t = x.copy();
    pg.all_reduce_(&mut t, ReduceOp::Avg).unwrap();
    assert_eq!(t, x);
    pg.barrier().unwrap();
    assert_eq!(pg.all_gather_bytes(b"gpu").unwrap(), [b"gpu".to_vec()]);
}

fn solo() -> DistEnv {
    DistEnv {
        rank: 0,
        world_size: 1,
        local_rank: 0,
        local_world_size: 1,
        master_addr: "127.0.0.1".into(),
        master_port: 0,
        agent_store: false,
        restart: 0,
    }
}
