//! DistEnv::from_vars on torchrun, Slurm and OpenMPI variables, none, and bad values.
use flowtune_dist::{DistEnv, DistError};
use std::collections::HashMap;

fn detect(vars: &[(&str, &str)]) -> Result<Option<DistEnv>, DistError> {
    let map: HashMap<String, String> =
        vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    DistEnv::from_vars(|name| map.get(name).cloned())
}

fn env(vars: &[(&str, &str)]) -> DistEnv {
    detect(vars).expect("valid variables").expect("a launch is detected")
}

fn error(vars: &[(&str, &str)]) -> String {
    detect(vars).expect_err("the variables are refused").to_string()
}

const TORCHRUN: &[(&str, &str)] = &[
    ("RANK", "5"),
    ("WORLD_SIZE", "8"),
    ("LOCAL_RANK", "1"),
    ("LOCAL_WORLD_SIZE", "4"),
    ("MASTER_ADDR", "10.0.0.1"),
    ("MASTER_PORT", "29400"),
    ("TORCHELASTIC_USE_AGENT_STORE", "True"),
    ("TORCHELASTIC_RESTART_COUNT", "2"),
];

#[test]
fn no_launcher_variables_mean_a_single_process() {
    assert_eq!(detect(&[]).unwrap(), None);
    assert_eq!(detect(&[("PATH", "/bin"), ("RANK", "")]).unwrap(), None);
}

#[test]
fn torchrun_variables() {
    let expected = DistEnv {
        rank: 5,
        world_size: 8,
        local_rank: 1,
        local_world_size: 4,
        master_addr: "10.0.0.1".into(),
        master_port: 29400,
        agent_store: true,
        restart: 2,
    };
    assert_eq!(env(TORCHRUN), expected);
    let own_store: Vec<_> =
        TORCHRUN.iter().filter(|(k, _)| *k != "TORCHELASTIC_USE_AGENT_STORE").copied().collect();
    assert!(!env(&own_store).agent_store);
}

#[test]
fn env_style_launch_defaults_to_one_node() {
    let e =
        env(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1234")]);
    assert_eq!((e.local_rank, e.local_world_size, e.agent_store, e.restart), (1, 2, false, 0));
}

#[test]
fn torchrun_bad_values_name_the_variable() {
    let with = |var: &str, value: &str| -> Vec<(String, String)> {
        TORCHRUN
            .iter()
            .map(|&(k, v)| (k.to_string(), if k == var { value } else { v }.to_string()))
            .collect()
    };
    let refuse = |var: &str, value: &str| {
        let vars = with(var, value);
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        error(&vars)
    };
    assert_eq!(refuse("RANK", "abc"), "RANK=abc is not a number");
    assert_eq!(refuse("MASTER_PORT", "70000"), "MASTER_PORT=70000 is not a port number (0-65535)");
    assert_eq!(
        refuse("TORCHELASTIC_RESTART_COUNT", "-1"),
        "TORCHELASTIC_RESTART_COUNT=-1 is not a number"
    );
    assert!(refuse("RANK", "8").contains("rank 8 is not below the world size 8"));
    assert!(refuse("LOCAL_RANK", "4").contains("local rank 4 is not below the local world size 4"));
    assert!(error(&[("RANK", "0"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")])
        .starts_with("WORLD_SIZE is not set"));
    assert!(error(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_PORT", "1")])
        .starts_with("MASTER_ADDR is not set"));
}

#[test]
fn slurm_variables() {
    let base = [("SLURM_PROCID", "6"), ("SLURM_NTASKS", "8"), ("SLURM_LOCALID", "2")];
    let e = env(&[
        &base[..],
        &[("SLURM_NTASKS_PER_NODE", "4"), ("SLURM_JOB_NODELIST", "gpu[03-04],login")],
    ]
    .concat());
    let expected = DistEnv {
        rank: 6,
        world_size: 8,
        local_rank: 2,
        local_world_size: 4,
        master_addr: "gpu03".into(),
        master_port: 29500,
        agent_store: false,
        restart: 0,
    };
    assert_eq!(e, expected);
    let e = env(&[
        &base[..],
        &[("MASTER_ADDR", "head"), ("MASTER_PORT", "4000"), ("SLURM_NODELIST", "x")],
    ]
    .concat());
    assert_eq!((e.master_addr.as_str(), e.master_port, e.local_world_size), ("head", 4000, 8));
    let derived = [
        ("SLURM_TASKS_PER_NODE", "4(x1),3(x2)"),
        ("SLURM_NODEID", "2"),
        ("SLURM_JOB_NODELIST", "n1,n2,n3"),
    ];
    let e = env(&[
        &[("SLURM_PROCID", "9"), ("SLURM_NTASKS", "10"), ("SLURM_LOCALID", "2")][..],
        &derived,
    ]
    .concat());
    assert_eq!((e.local_world_size, e.master_addr.as_str()), (3, "n1"));
}

#[test]
fn slurm_bad_values_name_the_variable() {
    let base = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_LOCALID", "0")];
    assert!(error(&base).starts_with("SLURM_JOB_NODELIST is not set"));
    let bad_list = error(&[&base[..], &[("SLURM_JOB_NODELIST", "n[a-b]")]].concat());
    assert!(
        bad_list.starts_with("SLURM_JOB_NODELIST=n[a-b] is not a Slurm node list"),
        "{bad_list}"
    );
    let bad_tasks =
        error(&[&base[..], &[("MASTER_ADDR", "h"), ("SLURM_TASKS_PER_NODE", "2(x")]].concat());
    assert!(bad_tasks.starts_with("SLURM_TASKS_PER_NODE=2(x is not"), "{bad_tasks}");
    assert_eq!(
        error(&[("SLURM_PROCID", "x")]),
        "SLURM_NTASKS is not set (SLURM_PROCID is set, so a Slurm (srun) launch is assumed)"
    );
}

#[test]
fn openmpi_variables() {
    let vars = [
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("MASTER_ADDR", "node0"),
    ];
    let e = env(&vars);
    assert_eq!((e.rank, e.world_size, e.local_rank, e.local_world_size), (3, 4, 1, 2));
    assert_eq!((e.master_addr.as_str(), e.master_port), ("node0", 29500));
    assert!(error(&vars[..4]).starts_with("MASTER_ADDR is not set (OMPI_COMM_WORLD_RANK is set"));
    assert_eq!(
        error(&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "two")]),
        "OMPI_COMM_WORLD_SIZE=two is not a number"
    );
}
