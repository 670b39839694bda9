//! What a spawned rank does, per scenario.
use flowtune_dist::{Backend, DistEnv, DistError, ProcessGroup, ReduceOp};
use std::time::{Duration, Instant};
use tch::{Kind, Tensor};

/// Runs `scenario` as the rank that the launcher variables describe; panics on a wrong result.
pub fn run(scenario: &str) {
    let env = DistEnv::detect().unwrap().expect("launcher variables are set");
    match scenario {
        "collectives" => collectives(&env),
        "torchrun" => {
            assert!(env.agent_store, "torchrun serves the store: {env:?}");
            collectives(&env)
        }
        "all_to_all" => all_to_all(&env),
        "dead_peer" => dead_peer(&env),
        "hung_peer" => hung_peer(&env),
        other => panic!("unknown scenario {other}"),
    }
}

fn values(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(&t.to_kind(Kind::Float).flatten(0, -1)).unwrap()
}

fn collectives(env: &DistEnv) {
    let pg = ProcessGroup::new(env, Backend::Gloo, Duration::from_secs(30)).unwrap();
    assert_eq!((pg.rank(), pg.size(), pg.backend()), (env.rank, 2, Backend::Gloo));
    let r = pg.rank() as f32;
    for kind in [Kind::Float, Kind::BFloat16] {
        for (op, expected) in [
            (ReduceOp::Sum, [3.0, 6.0]),
            (ReduceOp::Avg, [1.5, 3.0]),
            (ReduceOp::Max, [2.0, 4.0]),
            (ReduceOp::Min, [1.0, 2.0]),
        ] {
            let mut t = Tensor::from_slice(&[r + 1.0, 2.0 * (r + 1.0)]).to_kind(kind);
            pg.all_reduce_(&mut t, op).unwrap();
            assert_eq!(
                (t.kind(), values(&t)),
                (kind, expected.to_vec()),
                "all_reduce {op:?} {kind:?}"
            );
        }
    }

    let mut t = Tensor::full([3], 10.0 * r as f64, (Kind::Float, tch::Device::Cpu));
    pg.broadcast_(&mut t, 1).unwrap();
    assert_eq!(values(&t), [10.0; 3], "broadcast from root 1");

    let shard = Tensor::from_slice(&[100.0 * r, 100.0 * r + 1.0]).view([1, 2]);
    let mut out = Tensor::zeros([2, 2], (Kind::Float, tch::Device::Cpu));
    pg.all_gather_into(&mut out, &shard).unwrap();
    assert_eq!(values(&out), [0.0, 1.0, 100.0, 101.0], "all_gather_into");

    let full = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]) * (r as f64 + 1.0);
    for (op, expected) in
        [(ReduceOp::Sum, [[3.0, 6.0], [9.0, 12.0]]), (ReduceOp::Avg, [[1.5, 3.0], [4.5, 6.0]])]
    {
        let mut out = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu));
        pg.reduce_scatter_into(&mut out, &full, op).unwrap();
        assert_eq!(values(&out), expected[pg.rank()], "reduce_scatter_into {op:?}");
    }

    pg.barrier().unwrap();
    let mine: &[u8] = if pg.rank() == 0 { b"rank zero" } else { b"one" };
    assert_eq!(pg.all_gather_bytes(mine).unwrap(), [b"rank zero".to_vec(), b"one".to_vec()]);
    let mine: &[u8] = if pg.rank() == 0 { b"" } else { b"x" };
    assert_eq!(pg.all_gather_bytes(mine).unwrap(), [b"".to_vec(), b"x".to_vec()]);

    bad_arguments(&pg);
    pg.barrier().unwrap();
    println!("rank {} done", pg.rank());
}

/// Refused before any communication, so the ranks stay in step.
fn bad_arguments(pg: &ProcessGroup) {
    let mut strided = Tensor::zeros([2, 3], (Kind::Float, tch::Device::Cpu)).transpose(0, 1);
    let err = pg.all_reduce_(&mut strided, ReduceOp::Sum).unwrap_err();
    assert!(
        matches!(err, DistError::BadTensor { .. }) && err.to_string().contains("not contiguous"),
        "{err}"
    );
    let mut out = Tensor::zeros([3], (Kind::Float, tch::Device::Cpu));
    let err = pg
        .all_gather_into(&mut out, &Tensor::zeros([2], (Kind::Float, tch::Device::Cpu)))
        .unwrap_err();
    assert_eq!(err.to_string(), "all_gather_into: out has shape [3], expected [4] (2 × shard)");
    let err = pg.broadcast_(&mut out, 2).unwrap_err();
    assert_eq!(err.to_string(), "broadcast: root rank 2 is not below the group size 2");
}

/// The all-to-all and the differentiable exchange equal, bit for bit, what every rank's inputs
/// (all-gathered) say they must be; then the same inside sub-groups of 2 consecutive ranks.
fn all_to_all(env: &DistEnv) {
    let pg = ProcessGroup::new(env, Backend::Gloo, Duration::from_secs(30)).unwrap();
    check_all_to_all(&pg);
    if pg.size().is_multiple_of(2) {
        let first = pg.rank() / 2 * 2;
        let sub = pg.sub_group("pairs", &[first, first + 1]).unwrap();
        assert_eq!((sub.rank(), sub.size()), (pg.rank() % 2, 2));
        let mut t = Tensor::from_slice(&[pg.rank() as f32]);
        sub.all_reduce_(&mut t, ReduceOp::Sum).unwrap();
        assert_eq!(values(&t), [(2 * first + 1) as f32], "sum over the pair");
        check_all_to_all(&sub);
    }
    let err = pg.sub_group("other", &[(pg.rank() + 1) % pg.size()]).err().unwrap();
    assert!(err.to_string().contains("is not among"), "{err}");
    pg.barrier().unwrap();
    println!("rank {} done", pg.rank());
}

/// Every rank's `mine`, stacked along a new dim 0 (all-gathered).
fn everyone(pg: &ProcessGroup, mine: &Tensor) -> Tensor {
    let mut shape = mine.size();
    shape.insert(0, pg.size() as i64);
    let all = Tensor::zeros(&shape, (mine.kind(), tch::Device::Cpu));
    let mut flat = all.view([-1]);
    pg.all_gather_into(&mut flat, &mine.contiguous().view([-1])).unwrap();
    all
}

fn check_all_to_all(pg: &ProcessGroup) {
    let (n, me) = (pg.size() as i64, pg.rank() as i64);
    for kind in [Kind::Float, Kind::Double, Kind::BFloat16] {
        tch::manual_seed(7 + me);
        let input = Tensor::randn([n * 3, 2], (Kind::Float, tch::Device::Cpu)).to_kind(kind);
        let mut out = input.zeros_like();
        pg.all_to_all_into(&mut out, &input).unwrap();
        let all = everyone(pg, &input);
        let expected =
            Tensor::cat(&(0..n).map(|r| all.get(r).narrow(0, me * 3, 3)).collect::<Vec<_>>(), 0);
        assert!(out.equal(&expected), "all_to_all {kind:?} on rank {me} of {n}");
    }
    let odd = Tensor::zeros([n * 3 + 1], (Kind::Float, tch::Device::Cpu));
    let err = pg.all_to_all_into(&mut odd.copy(), &odd).unwrap_err();
    assert!(err.to_string().contains("must split into"), "{err}");

    // Ulysses: tokens (dim 1) of all heads → all tokens of this rank's heads (dim 2), and back.
    let (b, s, h, d) = (2, 3, 2 * n, 4);
    tch::manual_seed(100 + me);
    let x = Tensor::randn([b, s, h, d], (Kind::Double, tch::Device::Cpu)).set_requires_grad(true);
    let y = pg.exchange(&x, 2, 1).unwrap();
    let xs = everyone(pg, &x.detach());
    let tokens: Vec<Tensor> = (0..n).map(|r| xs.get(r)).collect();
    let expected = Tensor::cat(&tokens, 1).narrow(2, me * 2, 2);
    assert!(y.equal(&expected), "exchange on rank {me} of {n}");
    let w = Tensor::randn(y.size(), (Kind::Double, tch::Device::Cpu));
    (&y * &w).sum(Kind::Double).backward();
    // d(Σ y·w)/dx: each head's weights from the rank holding that head, at this rank's tokens.
    let ws = everyone(pg, &w);
    let heads: Vec<Tensor> = (0..n).map(|r| ws.get(r).narrow(1, me * s, s)).collect();
    assert!(x.grad().equal(&Tensor::cat(&heads, 2)), "exchange backward on rank {me} of {n}");
    let back = pg.exchange(&y.detach(), 1, 2).unwrap();
    assert!(back.equal(&x.detach()), "the exchange back restores the input");
}

/// Rank 1 leaves right after the rendezvous; rank 0's next collective must fail within the timeout.
fn dead_peer(env: &DistEnv) {
    let timeout = Duration::from_secs(5);
    let pg = ProcessGroup::new(env, Backend::Gloo, timeout).unwrap();
    if pg.rank() == 1 {
        std::process::exit(0);
    }
    let start = Instant::now();
    let mut t = Tensor::ones([4], (Kind::Float, tch::Device::Cpu));
    let err = pg.all_reduce_(&mut t, ReduceOp::Sum).expect_err("all_reduce with a dead peer fails");
    let took = start.elapsed();
    println!("rank 0: all_reduce with a dead peer failed after {took:?}: {err}");
    assert!(took < timeout + Duration::from_secs(3), "took {took:?}");
}

/// Rank 1 stays alive but never joins the collective; rank 0's all_reduce must time out.
fn hung_peer(env: &DistEnv) {
    let timeout = Duration::from_secs(3);
    let pg = ProcessGroup::new(env, Backend::Gloo, timeout).unwrap();
    if pg.rank() == 1 {
        std::thread::sleep(timeout * 2);
        std::process::exit(0);
    }
    let start = Instant::now();
    let mut t = Tensor::ones([4], (Kind::Float, tch::Device::Cpu));
    let err = pg.all_reduce_(&mut t, ReduceOp::Sum).expect_err("all_reduce with a hung peer fails");
    let took = start.elapsed();
    println!("rank 0: all_reduce with a hung peer failed after {took:?}: {err}");
    assert!(matches!(err, DistError::Timeout { op: "all_reduce", .. }), "{err:?}");
    assert!(err.to_string().starts_with("all_reduce timed out after 3s"), "{err}");
    assert!(took < timeout + Duration::from_secs(3), "took {took:?}");
}
