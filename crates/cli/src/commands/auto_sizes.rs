//! `rollout.batch_size: auto` and `trainer.micro_batch_size: auto`, fitted before anything loads:
//! the largest micro-batch the plan fits in a rank's memory (with one-row rollout batches, at most
//! a mini-batch), then the largest rollout batch beside it (at most a rank's samples of a step);
//! each then evened out to the same number of passes, so no pass is a small remainder. Samples
//! do not depend on either; the choice is said once.

use anyhow::anyhow;
use flowtune_config::Recipe;
use flowtune_plan::{verdict, Pipeline};

use super::plan::{read_model, setup};
use crate::Failure;

/// Fits the sizes `recipe` leaves open to `trainer.auto_memory_gib`, else to the memory of
/// `device` ([`memory_gib`]), for `gpus` ranks; the first rank says what it chose.
pub(crate) fn fit_to_device(
    recipe: &mut Recipe,
    device: tch::Device,
    gpus: u64,
) -> Result<(), Failure> {
    if !recipe.auto.any() {
        return Ok(());
    }
    let memory = match recipe.trainer.auto_memory_gib {
        Some(gib) => Some((gib, "(trainer.auto_memory_gib)")),
        None => memory_gib(device, gpus),
    };
    let (gib, what) = memory.ok_or_else(|| {
        Failure::input(anyhow!(
            "auto sizes: this device's memory is unknown; set trainer.auto_memory_gib"
        ))
    })?;
    let chosen = fit(recipe, gpus, gib, what)?;
    if let (Some(line), true) = (chosen, std::env::var("RANK").map_or(true, |r| r == "0")) {
        eprintln!("{line}");
    }
    Ok(())
}

/// Sets the sizes `recipe` leaves to the planner for `gpus` ranks of `memory_gib` each (`what`
/// says where the figure comes from) and returns the line that says what it chose; `None` when
/// nothing was left open.
pub(crate) fn fit(
    recipe: &mut Recipe,
    gpus: u64,
    memory_gib: f64,
    what: &str,
) -> Result<Option<String>, Failure> {
    let auto = recipe.auto;
    if !auto.any() {
        return Ok(None);
    }
    let (_, pipe) = read_model(recipe)?;
    let per_rank = setup(recipe, &pipe, gpus, memory_gib).map_err(Failure::input)?.samples();
    let per_rank = (per_rank as usize).max(1);
    let needs = flowtune_objectives::algorithm(&recipe.algorithm).map_err(Failure::input)?.needs;
    // A mini-batch's samples on one rank (its group's share), the most a micro-batch can use.
    let groups = (gpus as usize / recipe.trainer.sequence_parallel_size.max(1)).max(1);
    let mini = recipe.trainer.ppo_mini_batch_size * recipe.rollout.n;
    let mini = mini.div_ceil(groups).clamp(1, per_rank);
    let mut chosen = vec![];
    if auto.micro_batch {
        if auto.rollout_batch {
            recipe.rollout.batch_size = 1;
        }
        // Whole prompt groups where the algorithm scores them together.
        let unit = if needs.whole_groups { recipe.rollout.n.max(1) } else { 1 };
        let sizes: Vec<usize> = (unit..=mini.max(unit)).step_by(unit).collect();
        let micro = largest(recipe, &pipe, gpus, memory_gib, &sizes, |r, s| {
            r.trainer.micro_batch_size = s
        })?;
        let micro = micro.ok_or_else(|| too_small(memory_gib, what, "trainer.micro_batch_size"))?;
        let micro = even(mini, micro, unit);
        recipe.trainer.micro_batch_size = micro;
        chosen.push(format!("trainer.micro_batch_size {micro}"));
    }
    if auto.rollout_batch {
        let sizes: Vec<usize> = (1..=per_rank).collect();
        let rows =
            largest(recipe, &pipe, gpus, memory_gib, &sizes, |r, s| r.rollout.batch_size = s)?;
        let rows = rows.ok_or_else(|| too_small(memory_gib, what, "rollout.batch_size"))?;
        let rows = even(per_rank, rows, 1);
        recipe.rollout.batch_size = rows;
        chosen.push(format!("rollout.batch_size {rows}"));
    }
    recipe.auto = Default::default();
    Ok(Some(format!(
        "auto sizes: {} (the largest flowtune plan fits in {memory_gib:.1} GiB {what})",
        chosen.join(", ")
    )))
}

/// Sets the largest of `sizes` (ascending) with which `recipe` fits, by `set`; `None` when even
/// the first does not (the recipe keeps it then).
fn largest(
    recipe: &mut Recipe,
    pipe: &Pipeline,
    gpus: u64,
    memory_gib: f64,
    sizes: &[usize],
    set: impl Fn(&mut Recipe, usize),
) -> Result<Option<usize>, Failure> {
    let mut best = None;
    for &size in sizes {
        set(recipe, size);
        let planned = setup(recipe, pipe, gpus, memory_gib).map_err(Failure::input)?;
        if !verdict(pipe, &planned).fits {
            break;
        }
        best = Some(size);
    }
    set(recipe, best.or(sizes.first().copied()).unwrap_or(1));
    Ok(best)
}

/// The smallest size, in multiples of `unit`, that covers `total` in as few passes as `size`
/// does (never more than `size`).
fn even(total: usize, size: usize, unit: usize) -> usize {
    let passes = total.div_ceil(size.max(1));
    let even = total.div_ceil(passes).div_ceil(unit) * unit;
    even.min(size)
}

fn too_small(memory_gib: f64, what: &str, key: &str) -> Failure {
    Failure::input(anyhow!(
        "{key}: auto finds no size that fits {memory_gib:.1} GiB {what} by flowtune plan; see \
         `flowtune plan` for what does, or set trainer.auto_memory_gib"
    ))
}

/// GiB of memory a rank of `gpus` has for its work on `device`, with where the figure comes from:
/// what one GPU has free, or in a job of several ranks its total (the same on every rank, so
/// that all choose alike); the host's available memory on the CPU.
pub(crate) fn memory_gib(device: tch::Device, gpus: u64) -> Option<(f64, &'static str)> {
    let gib = |bytes: u64| bytes as f64 / flowtune_plan::GIB;
    match device {
        tch::Device::Cuda(i) if gpus > 1 => {
            flowtune_cuda::device_info(i).map(|d| (gib(d.total_memory_bytes), "per GPU in all"))
        }
        tch::Device::Cuda(i) => flowtune_cuda::free_memory(i).map(|b| (gib(b), "free")),
        _ => {
            let info = std::fs::read_to_string("/proc/meminfo").ok()?;
            let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
            let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some((kib * 1024.0 / flowtune_plan::GIB, "available on the host"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::even;

    #[test]
    fn sizes_even_out_over_the_same_passes() {
        assert_eq!(even(128, 67, 1), 64);
        assert_eq!(even(128, 128, 1), 128);
        assert_eq!(even(16, 5, 1), 4);
        assert_eq!(even(16, 7, 1), 6);
        assert_eq!(even(24, 16, 4), 12);
        assert_eq!(even(10, 3, 1), 3);
    }
}
