//! Does a plan fit, and if not, the cheapest change that makes it fit.

use serde::Serialize;

use crate::memory::plan;
use crate::{Offload, Pipeline, Setup, Sharding, StateOffload, GIB};

/// Share of the device a plan may fill; the other 10 % is the reserve for the CUDA context,
/// NCCL buffers, cuBLAS workspace and fragmentation (large-models.md §2.1, an assumption).
pub const USABLE: f64 = 0.9;

/// The answer for a setup.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub fits: bool,
    pub budget_gib: f64,
    /// Settings that make it fit (`key=value` overrides or `--gpus N`), when it does not as is.
    pub changes: Vec<String>,
    /// Device GiB per rank with the changes.
    pub changed_gib: Option<f64>,
    /// One line for people.
    pub message: String,
}

fn device_gib(pipe: &Pipeline, s: &Setup) -> f64 {
    let p = plan(pipe, s);
    p.device_bytes.max(p.load_bytes) as f64 / GIB
}

/// One change to a setup.
#[derive(Debug, Clone, Copy)]
enum Change {
    Checkpointing,
    Offload(Offload),
    MicroBatch(u64),
    RolloutBatch(u64),
    Gpus(u64),
    State(StateOffload),
    ShardFrozen,
    ShardFull,
    SequenceParallel(u64),
}

impl Change {
    fn apply(self, s: &mut Setup) {
        match self {
            Self::Checkpointing => s.gradient_checkpointing = true,
            Self::Offload(o) => s.offload = o,
            Self::MicroBatch(m) => s.micro_batch = m,
            Self::RolloutBatch(b) => s.rollout_batch = b,
            Self::Gpus(n) => s.gpus = n,
            Self::State(o) => s.state_offload = o,
            Self::ShardFrozen => s.sharding = Sharding::Frozen,
            Self::ShardFull => s.sharding = Sharding::Full,
            Self::SequenceParallel(n) => s.sequence_parallel = n,
        }
    }

    /// As an override or flag.
    fn text(self) -> String {
        match self {
            Self::Checkpointing => "trainer.gradient_checkpointing=true".into(),
            Self::Offload(Offload::Encoders) => "model.offload=encoders".into(),
            Self::Offload(_) => "model.offload=encoders_and_vae".into(),
            Self::MicroBatch(m) => format!("trainer.micro_batch_size={m}"),
            Self::RolloutBatch(b) => format!("rollout.batch_size={b}"),
            Self::Gpus(n) => format!("--gpus {n}"),
            Self::State(StateOffload::All) => "trainer.offload=all".into(),
            Self::State(_) => "trainer.offload=optimizer".into(),
            Self::ShardFrozen => "trainer.sharding=frozen".into(),
            Self::ShardFull => "trainer.sharding=full".into(),
            Self::SequenceParallel(n) => format!("trainer.sequence_parallel_size={n}"),
        }
    }
}

/// `setup` with `changes` applied in order.
fn with(setup: &Setup, changes: &[Change]) -> Setup {
    let mut s = setup.clone();
    for c in changes {
        c.apply(&mut s);
    }
    s
}

/// Whether `setup` fits; if not, tries in order checkpointing, offloading the encoders, then the
/// VAE, (LoRA on several GPUs) sharding the frozen blocks, halving the micro-batch (and the
/// rollout batch), sequence parallelism over more ranks (each size dividing the GPUs and the
/// heads), and (full fine-tuning, where ZeRO-1 shards masters and Adam
/// moments) more GPUs, keeping each change, then drops those the result does not need.
pub fn verdict(pipe: &Pipeline, setup: &Setup) -> Verdict {
    let budget = USABLE * setup.gpu_memory_gib;
    let fits = |s: &Setup| device_gib(pipe, s) <= budget;
    let now = device_gib(pipe, setup);
    let verdict = |fits, changes, changed_gib, message| Verdict {
        fits,
        budget_gib: budget,
        changes,
        changed_gib,
        message,
    };
    if now <= budget {
        let m = format!("fits: {now:.1} GiB ≤ {budget:.1} (90 % of {} GiB)", setup.gpu_memory_gib);
        return verdict(true, vec![], None, m);
    }
    let mut changes = vec![];
    if !setup.gradient_checkpointing {
        changes.push(Change::Checkpointing);
    }
    for o in [Offload::Encoders, Offload::EncodersAndVae] {
        if setup.offload < o {
            changes.push(Change::Offload(o));
        }
    }
    if !setup.full && setup.gpus > 1 && setup.sharding != Sharding::Frozen {
        changes.push(Change::ShardFrozen);
    }
    if setup.full && setup.sharding != Sharding::Full {
        changes.push(Change::ShardFull);
    }
    let mut m = setup.micro_batch;
    while m > 1 {
        m /= 2;
        changes.push(Change::MicroBatch(m));
    }
    let mut b = setup.rollout_rows();
    while b > 1 {
        b /= 2;
        changes.push(Change::RolloutBatch(b));
    }
    // Sequence parallelism: every S that divides the GPUs and the heads, smallest first.
    let heads = pipe.denoiser().heads;
    for n in setup.sequence_parallel.max(1) + 1..=setup.gpus {
        if setup.gpus.is_multiple_of(n) && heads.is_multiple_of(n) {
            changes.push(Change::SequenceParallel(n));
        }
    }
    if setup.full {
        let base = with(setup, &changes);
        if let Some(n) = (setup.gpus + 1..=MAX_GPUS)
            .filter(|n| n.is_multiple_of(setup.sequence_parallel.max(1)))
            .find(|&n| fits(&with(&base, &[Change::Gpus(n)])))
        {
            changes.push(Change::Gpus(n));
        }
    }
    if setup.state_offload < StateOffload::Optimizer {
        changes.push(Change::State(StateOffload::Optimizer));
    }
    // Past that, the blocks' slices go to the host too, sharded over one GPU if need be.
    if setup.state_offload < StateOffload::All {
        match with(setup, &changes).sharding {
            Sharding::Frozen | Sharding::Full => {}
            _ if setup.full => changes.push(Change::ShardFull),
            _ => changes.push(Change::ShardFrozen),
        }
        changes.push(Change::State(StateOffload::All));
    }
    let Some(last) = (1..=changes.len()).find(|&k| fits(&with(setup, &changes[..k]))) else {
        let more = if setup.full {
            format!(" or full sharding over up to {MAX_GPUS} GPUs")
        } else {
            String::new()
        };
        let m = format!(
            "does not fit ({now:.1} GiB > {budget:.1}), nor with checkpointing, offload, \
             sharding, sequence parallelism, micro-batch 1, rollout batch 1, the trained state on the host{more}"
        );
        return verdict(false, vec![], None, m);
    };
    // Drop each earlier change the fit does not need.
    let mut kept = changes[..last].to_vec();
    let mut i = 0;
    while i + 1 < kept.len() {
        let mut without = kept.clone();
        without.remove(i);
        if fits(&with(setup, &without)) {
            kept = without;
        } else {
            i += 1;
        }
    }
    let gib = device_gib(pipe, &with(setup, &kept));
    let texts: Vec<String> = kept.iter().map(|c| c.text()).collect();
    let m = format!(
        "does not fit ({now:.1} GiB > {budget:.1}); fits with {} ({gib:.1} GiB)",
        texts.join(" ")
    );
    verdict(false, texts, Some(gib), m)
}

/// The most GPUs the search tries.
const MAX_GPUS: u64 = 1024;
