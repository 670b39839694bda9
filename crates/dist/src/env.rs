//! Where this process sits in a launched job: torchrun's, Slurm's or OpenMPI's variables.
use crate::DistError;
use std::str::FromStr;

/// The port a Slurm or mpirun launch uses when `MASTER_PORT` is not set.
const DEFAULT_PORT: u16 = 29500;

/// Where this process sits in a launched job, from torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
/// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT),
/// else Slurm's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE or derived; MASTER_ADDR
/// from env or the first host of SLURM_JOB_NODELIST; MASTER_PORT from env or 29500), else OpenMPI's
/// OMPI_COMM_WORLD_* (with MASTER_ADDR exported by the user).
#[derive(Debug, Clone, PartialEq)]
pub struct DistEnv {
    /// This process's rank in the job, `0..world_size`.
    pub rank: usize,
    /// Number of processes in the job.
    pub world_size: usize,
    /// This process's rank on its node; the GPU it uses.
    pub local_rank: usize,
    /// Number of processes on this node.
    pub local_world_size: usize,
    /// Host of the rendezvous TCPStore.
    pub master_addr: String,
    /// Port of the rendezvous TCPStore.
    pub master_port: u16,
    /// The launcher (torchrun's agent) already serves the TCPStore, so rank 0 must not.
    pub agent_store: bool,
    /// How many times the launcher restarted the job; keys are prefixed with it.
    pub restart: u32,
}

impl DistEnv {
    /// None when no launcher variables are set (a plain single process).
    pub fn detect() -> Result<Option<DistEnv>, DistError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Same, from a lookup function (for tests without touching the process env).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<DistEnv>, DistError> {
        let vars = Vars(&get);
        let env = if vars.has("RANK") || vars.has("WORLD_SIZE") {
            torchrun(&vars)?
        } else if vars.has("SLURM_PROCID") {
            slurm(&vars)?
        } else if vars.has("OMPI_COMM_WORLD_RANK") {
            openmpi(&vars)?
        } else {
            return Ok(None);
        };
        env.check()?;
        Ok(Some(env))
    }

    fn check(&self) -> Result<(), DistError> {
        let bad = |what: String| Err(DistError::Inconsistent(what));
        if self.world_size == 0 {
            return bad("the world size is 0".into());
        }
        if self.rank >= self.world_size {
            return bad(format!(
                "rank {} is not below the world size {}",
                self.rank, self.world_size
            ));
        }
        if self.local_rank >= self.local_world_size {
            let (r, n) = (self.local_rank, self.local_world_size);
            return bad(format!("local rank {r} is not below the local world size {n}"));
        }
        if self.local_world_size > self.world_size {
            let (n, w) = (self.local_world_size, self.world_size);
            return bad(format!("local world size {n} exceeds the world size {w}"));
        }
        Ok(())
    }
}

/// A variable lookup with parsing that names the variable in its errors.
struct Vars<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Vars<'_> {
    fn get(&self, var: &str) -> Option<String> {
        (self.0)(var).filter(|v| !v.is_empty())
    }

    fn has(&self, var: &str) -> bool {
        self.get(var).is_some()
    }

    fn parse<T: FromStr>(&self, var: &str, expected: &'static str) -> Result<Option<T>, DistError> {
        self.get(var)
            .map(|value| {
                value.trim().parse().map_err(|_| DistError::BadVar {
                    var: var.to_owned(),
                    value,
                    expected,
                })
            })
            .transpose()
    }

    fn number(&self, var: &'static str, why: &'static str) -> Result<usize, DistError> {
        self.parse(var, "a number")?.ok_or(DistError::MissingVar { var, why })
    }

    fn port(&self) -> Result<Option<u16>, DistError> {
        self.parse("MASTER_PORT", "a port number (0-65535)")
    }
}

const TORCHRUN: &str = "RANK or WORLD_SIZE is set, so a torchrun / env:// launch is assumed";
const SLURM: &str = "SLURM_PROCID is set, so a Slurm (srun) launch is assumed";
const OMPI: &str =
    "OMPI_COMM_WORLD_RANK is set, so an mpirun launch is assumed; export MASTER_ADDR (mpirun -x)";

/// torchrun (or a hand-made env:// launch: LOCAL_* then default to a single node).
fn torchrun(vars: &Vars) -> Result<DistEnv, DistError> {
    let rank = vars.number("RANK", TORCHRUN)?;
    let world_size = vars.number("WORLD_SIZE", TORCHRUN)?;
    Ok(DistEnv {
        rank,
        world_size,
        local_rank: vars.parse("LOCAL_RANK", "a number")?.unwrap_or(rank),
        local_world_size: vars.parse("LOCAL_WORLD_SIZE", "a number")?.unwrap_or(world_size),
        master_addr: vars
            .get("MASTER_ADDR")
            .ok_or(DistError::MissingVar { var: "MASTER_ADDR", why: TORCHRUN })?,
        master_port: vars
            .port()?
            .ok_or(DistError::MissingVar { var: "MASTER_PORT", why: TORCHRUN })?,
        agent_store: vars
            .get("TORCHELASTIC_USE_AGENT_STORE")
            .is_some_and(|v| v.eq_ignore_ascii_case("true")),
        restart: vars.parse("TORCHELASTIC_RESTART_COUNT", "a number")?.unwrap_or(0),
    })
}

/// srun: one task per process.
fn slurm(vars: &Vars) -> Result<DistEnv, DistError> {
    let world_size = vars.number("SLURM_NTASKS", SLURM)?;
    let local_world_size = match vars.parse("SLURM_NTASKS_PER_NODE", "a number")? {
        Some(n) => n,
        None => slurm_tasks_on_node(vars, world_size)?,
    };
    let master_addr = match vars.get("MASTER_ADDR") {
        Some(addr) => addr,
        None => {
            let var = if vars.has("SLURM_JOB_NODELIST") {
                "SLURM_JOB_NODELIST"
            } else {
                "SLURM_NODELIST"
            };
            let list = vars.get(var).ok_or(DistError::MissingVar {
                var: "SLURM_JOB_NODELIST",
                why: "neither MASTER_ADDR nor a Slurm node list names the rendezvous host",
            })?;
            first_host(&list).ok_or_else(|| DistError::BadVar {
                var: var.to_owned(),
                value: list.clone(),
                expected: "a Slurm node list like node[01-04],gpu7",
            })?
        }
    };
    Ok(DistEnv {
        rank: vars.number("SLURM_PROCID", SLURM)?,
        world_size,
        local_rank: vars.number("SLURM_LOCALID", SLURM)?,
        local_world_size,
        master_addr,
        master_port: vars.port()?.unwrap_or(DEFAULT_PORT),
        agent_store: false,
        restart: 0,
    })
}

/// Tasks on this node from SLURM_TASKS_PER_NODE ("4(x2),3") and SLURM_NODEID, else the whole job.
fn slurm_tasks_on_node(vars: &Vars, world_size: usize) -> Result<usize, DistError> {
    let Some(spec) = vars.get("SLURM_TASKS_PER_NODE") else {
        return Ok(world_size);
    };
    let node: usize = vars.parse("SLURM_NODEID", "a number")?.unwrap_or(0);
    let bad = || DistError::BadVar {
        var: "SLURM_TASKS_PER_NODE".into(),
        value: spec.clone(),
        expected: "a Slurm task count list like 4(x2),3",
    };
    let mut seen = 0;
    for part in spec.split(',') {
        let (count, repeat) = match part.split_once("(x") {
            Some((count, rest)) => {
                (count, rest.strip_suffix(')').ok_or_else(bad)?.parse().map_err(|_| bad())?)
            }
            None => (part, 1usize),
        };
        seen += repeat;
        if node < seen {
            return count.trim().parse().map_err(|_| bad());
        }
    }
    Err(bad())
}

/// The first host of a Slurm node list: "node[01-04],x" → "node01", "a-[3,5-7]-b[2-3]" → "a-3-b2".
fn first_host(list: &str) -> Option<String> {
    let mut host = String::new();
    let mut chars = list.trim().chars();
    while let Some(c) = chars.next() {
        match c {
            ',' => break,
            '[' => {
                let group: String = chars.by_ref().take_while(|&c| c != ']').collect();
                let first = group.split([',', '-']).next()?.trim();
                if first.is_empty() || !first.chars().all(|c| c.is_ascii_digit()) {
                    return None;
                }
                host.push_str(first);
            }
            ']' => return None,
            c => host.push(c),
        }
    }
    (!host.is_empty()).then_some(host)
}

/// mpirun (OpenMPI): the user exports MASTER_ADDR (and optionally MASTER_PORT).
fn openmpi(vars: &Vars) -> Result<DistEnv, DistError> {
    let rank = vars.number("OMPI_COMM_WORLD_RANK", OMPI)?;
    let world_size = vars.number("OMPI_COMM_WORLD_SIZE", OMPI)?;
    Ok(DistEnv {
        rank,
        world_size,
        local_rank: vars.parse("OMPI_COMM_WORLD_LOCAL_RANK", "a number")?.unwrap_or(rank),
        local_world_size: vars
            .parse("OMPI_COMM_WORLD_LOCAL_SIZE", "a number")?
            .unwrap_or(world_size),
        master_addr: vars
            .get("MASTER_ADDR")
            .ok_or(DistError::MissingVar { var: "MASTER_ADDR", why: OMPI })?,
        master_port: vars.port()?.unwrap_or(DEFAULT_PORT),
        agent_store: false,
        restart: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::first_host;

    #[test]
    fn first_host_of_slurm_node_lists() {
        assert_eq!(first_host("node[01-04],x").as_deref(), Some("node01"));
        assert_eq!(first_host("gpu7,gpu8").as_deref(), Some("gpu7"));
        assert_eq!(first_host("solo").as_deref(), Some("solo"));
        assert_eq!(first_host("a-[3,5-7]-b[2-3],c").as_deref(), Some("a-3-b2"));
        assert_eq!(first_host("n[007]").as_deref(), Some("n007"));
        assert_eq!(first_host("n[x-y]"), None);
        assert_eq!(first_host(""), None);
    }
}
