//! Checkpoints: `checkpoints/step_NNNNNN/` with the adapters (diffusers/PEFT layout) or, under full
//! fine-tuning, the transformer's weights, the optimizer state (with the EMA and the algorithm's
//! copies of the weights, such as an old policy) and the loop state (with the algorithm's own
//! state). Written into a
//! temporary directory and renamed, so a crash mid-write leaves the previous checkpoint as the
//! newest complete one. In a job, rank 0 writes it; under a sharded optimizer each rank adds its
//! share of the moments (`optimizer.rank<R>.safetensors`), stored by parameter name, so a job with
//! another number of ranks resumes from it. Under `trainer.sharding: full` each transformer block
//! is gathered and written whole by one rank (`blocks/<block>.safetensors` and
//! `<block>.state.safetensors`, by weight name), so no rank holds more than one block of it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use flowtune_models::shard::ShardedBlocks;
use flowtune_models::TrainableDenoiser;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::dist::Comm;
use crate::optim::{AdamW, Ema};
use crate::stateful::{Scope, Stateful};
use crate::TrainError;

/// The parts whose tensors a checkpoint holds beside the model's weights: the optimizer, the
/// copies of the weights (the EMA, an algorithm's old policy or anchor) and any other part
/// (the algorithm) with tensors of its own.
pub(crate) struct Parts<'a> {
    pub optimizer: &'a AdamW,
    pub shadows: Vec<&'a Ema>,
    pub others: Vec<&'a dyn Stateful>,
}

impl Parts<'_> {
    /// What the parts see: the trained parameters and this rank's slices of sharded blocks.
    fn scope(&self) -> Scope<'_> {
        Scope { params: &self.optimizer.params, sliced: self.optimizer.local() }
    }

    /// Every part's tensors but the slices of sharded blocks, by checkpoint name.
    fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let scope = self.scope();
        let mut named = self.optimizer.state_tensors(&scope);
        for shadow in &self.shadows {
            named.extend(shadow.state_tensors(&scope));
        }
        for part in &self.others {
            named.extend(part.state_tensors(&scope));
        }
        named
    }
}

/// The loop state saved beside the weights.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LoopState {
    /// Training steps completed.
    pub step: u64,
    /// The data source's state ([`Stateful::state`]: the loader's epoch and cursor).
    pub loader: serde_json::Value,
    /// The optimizer's state (its update count).
    pub optimizer_steps: serde_json::Value,
    /// The step's metric line as known before the save (without the save's own timings), so a run
    /// killed between the save and the log line still has its line restored on resume.
    #[serde(default)]
    pub metrics: serde_json::Value,
    /// The algorithm's own state ([`Stateful::state`]); checkpoints written before algorithms
    /// kept their own state name GARDO's `gardo`.
    #[serde(default, alias = "gardo", skip_serializing_if = "serde_json::Value::is_null")]
    pub algorithm: serde_json::Value,
}

const ADAPTERS: &str = "adapters.safetensors";
/// The transformer's weights, under full fine-tuning.
const WEIGHTS: &str = "transformer.safetensors";
const OPTIMIZER: &str = "optimizer.safetensors";
const STATE: &str = "state.json";
/// The folder of the sharded blocks' files, one pair per block.
const BLOCKS: &str = "blocks";

/// A sharded block's whole weights, and its optimizer state and weight copies.
fn block_files(dir: &Path, block: &str) -> (PathBuf, PathBuf) {
    let blocks = dir.join(BLOCKS);
    (blocks.join(format!("{block}.safetensors")), blocks.join(format!("{block}.state.safetensors")))
}

/// This rank's share of the optimizer state under a sharded optimizer.
fn rank_file(rank: usize) -> String {
    format!("optimizer.rank{rank}.safetensors")
}

/// Writes a checkpoint for `state.step` with the tensors of `parts` and keeps the newest `keep`;
/// every rank of a job calls it.
pub(crate) fn save(
    root: &Path,
    model: &dyn TrainableDenoiser,
    parts: &Parts<'_>,
    state: &LoopState,
    keep: usize,
    comm: &Comm,
) -> Result<PathBuf, TrainError> {
    let optimizer = parts.optimizer;
    let dir = root.join(format!("step_{:06}", state.step));
    let tmp = root.join(format!(".step_{:06}.tmp", state.step));
    let blocks = model.sharded().filter(|s| s.trains());
    if comm.is_main() {
        let _ = std::fs::remove_dir_all(&tmp);
        let made = if blocks.is_some() { tmp.join(BLOCKS) } else { tmp.clone() };
        std::fs::create_dir_all(&made).map_err(|e| TrainError::io(&made, e))?;
    }
    comm.barrier()?;
    // Trained sharded blocks: each gathered from every rank and written whole by one.
    if let Some(blocks) = blocks {
        write_blocks(blocks, parts, &tmp, comm)?;
    }
    if !comm.is_main() {
        if optimizer.shards_state() {
            let named = optimizer.state_tensors(&parts.scope());
            Tensor::write_safetensors(&named, tmp.join(rank_file(comm.rank())))?;
        }
        comm.barrier()?;
        comm.barrier()?;
        return Ok(dir);
    }
    match (model.adapters().is_some(), blocks) {
        (true, _) => model.save_lora(&tmp.join(ADAPTERS))?,
        (false, None) => model.save_weights(&tmp.join(WEIGHTS))?,
        (false, Some(blocks)) => {
            // The weights outside the blocks; the blocks are in their own files.
            let others: Vec<(String, Tensor)> = model
                .store()
                .variables()
                .into_iter()
                .filter(|(n, _)| !blocks.holds(n))
                .map(|(n, t)| (n, t.detach().to_device(Device::Cpu)))
                .collect();
            Tensor::write_safetensors(&others, tmp.join(WEIGHTS))?;
        }
    }
    Tensor::write_safetensors(&parts.state_tensors(), tmp.join(OPTIMIZER))?;
    let text = serde_json::to_string_pretty(state).expect("state is JSON");
    std::fs::write(tmp.join(STATE), text).map_err(|e| TrainError::io(&tmp, e))?;
    // Every rank's files on disk before the rename makes the checkpoint visible.
    comm.barrier()?;
    for folder in [tmp.clone(), tmp.join(BLOCKS)].iter().filter(|f| f.exists()) {
        for entry in std::fs::read_dir(folder).map_err(|e| TrainError::io(folder, e))?.flatten() {
            std::fs::File::open(entry.path())
                .and_then(|f| f.sync_all())
                .map_err(|e| TrainError::io(&entry.path(), e))?;
        }
    }
    crate::manifest::write(&tmp)?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).map_err(|e| TrainError::io(&dir, e))?;
    let _ = std::fs::File::open(root).and_then(|d| d.sync_all());
    // Keep the newest `keep` up to this step (never one after it) and drop crash leftovers.
    let older = complete_checkpoints(root)?.into_iter().rev().filter(|(s, _)| *s < state.step);
    for (i, (_, path)) in older.enumerate() {
        if i + 1 >= keep {
            let _ = std::fs::remove_dir_all(path);
        }
    }
    for entry in std::fs::read_dir(root).map_err(|e| TrainError::io(root, e))?.flatten() {
        if entry.file_name().to_string_lossy().ends_with(".tmp") {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    comm.barrier()?;
    Ok(dir)
}

/// Writes every trained sharded block's whole weights (in the model's dtype) and its Adam
/// moments, f32 masters (of a model in another dtype) and weight copies (f32), by weight name:
/// block i is gathered on every rank and written by rank i mod N, one block at a time.
fn write_blocks(
    blocks: &ShardedBlocks,
    parts: &Parts<'_>,
    tmp: &Path,
    comm: &Comm,
) -> Result<(), TrainError> {
    let masters = blocks.masters();
    let mut sliced = parts.optimizer.moments().to_vec();
    if blocks.kind() != Kind::Float {
        sliced.push(("master", &masters));
    }
    sliced.extend(parts.shadows.iter().map(|shadow| (shadow.name, &shadow.shadow)));
    let cpu = |named: Vec<(String, Tensor)>| -> Vec<(String, Tensor)> {
        named.into_iter().map(|(n, t)| (n, t.to_device(Device::Cpu))).collect()
    };
    for (i, block) in blocks.blocks().iter().enumerate() {
        let weights = blocks.unshard_block(block, &masters[block], blocks.kind())?;
        let mut state = vec![];
        for (prefix, part) in &sliced {
            for (name, t) in blocks.unshard_block(block, &part[block], Kind::Float)? {
                state.push((format!("{prefix}.{name}"), t));
            }
        }
        if i % comm.size() == comm.rank() {
            let (weights_file, state_file) = block_files(tmp, block);
            Tensor::write_safetensors(&cpu(weights), weights_file)?;
            Tensor::write_safetensors(&cpu(state), state_file)?;
        }
    }
    Ok(())
}

/// The entries `prefix.<weight>` of `saved`, by weight name.
fn prefixed(saved: &BTreeMap<String, Tensor>, prefix: &str) -> BTreeMap<String, Tensor> {
    let named = saved.iter().filter_map(|(n, t)| {
        Some((n.strip_prefix(prefix)?.strip_prefix('.')?.to_string(), t.shallow_clone()))
    });
    named.collect()
}

/// The files of a checkpoint's sharded blocks (weights, states), none for other checkpoints.
fn blocks_in(dir: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>), TrainError> {
    let folder = dir.join(BLOCKS);
    let Ok(entries) = std::fs::read_dir(&folder) else { return Ok(Default::default()) };
    let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    files.sort();
    Ok(files.into_iter().partition(|f| !f.to_string_lossy().ends_with(".state.safetensors")))
}

/// Complete checkpoints under `root` as (step, directory), oldest first.
pub fn complete_checkpoints(root: &Path) -> Result<Vec<(u64, PathBuf)>, TrainError> {
    let Ok(entries) = std::fs::read_dir(root) else { return Ok(vec![]) };
    let mut dirs: Vec<(u64, PathBuf)> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join(STATE).exists())
        .filter_map(|p| Some((p.file_name()?.to_str()?.strip_prefix("step_")?.parse().ok()?, p)))
        .collect();
    dirs.sort();
    Ok(dirs)
}

/// The newest checkpoint under `root` that is as its manifest wrote it, saying which newer ones
/// it skips and why (with `say`).
pub(crate) fn newest_whole(
    root: &Path,
    say: impl Fn(String),
) -> Result<Option<(u64, PathBuf)>, TrainError> {
    for (step, dir) in complete_checkpoints(root)?.into_iter().rev() {
        match crate::manifest::damage(&dir) {
            None => return Ok(Some((step, dir))),
            Some(why) => say(format!("warning: skipping checkpoint {}: {why}", dir.display())),
        }
    }
    Ok(None)
}

/// Moves the complete checkpoints after step `start` (the future of a run resumed from an older
/// one, or of an earlier run in this folder) to `root/abandoned/`, where nothing deletes them and
/// `resume: auto` does not look; says what it moved.
pub(crate) fn set_aside_after(
    root: &Path,
    start: u64,
    say: impl Fn(String),
) -> Result<(), TrainError> {
    let aside = root.join("abandoned");
    for (_, dir) in complete_checkpoints(root)?.into_iter().filter(|(s, _)| *s > start) {
        std::fs::create_dir_all(&aside).map_err(|e| TrainError::io(&aside, e))?;
        let name = dir.file_name().expect("step_N").to_string_lossy().to_string();
        let mut to = aside.join(&name);
        for n in 1.. {
            if !to.exists() {
                break;
            }
            to = aside.join(format!("{name}.{n}"));
        }
        std::fs::rename(&dir, &to).map_err(|e| TrainError::io(&dir, e))?;
        say(format!("moved {} (after step {start}) to {}", dir.display(), to.display()));
    }
    Ok(())
}

/// Restores the adapters (or weights) and the tensors of `parts` from `dir` and returns its loop
/// state, whose JSON states the caller gives back to their parts.
pub(crate) fn load(
    dir: &Path,
    model: &mut dyn TrainableDenoiser,
    parts: &Parts<'_>,
) -> Result<LoopState, TrainError> {
    let optimizer = parts.optimizer;
    let state_file = dir.join(STATE);
    let text = std::fs::read_to_string(&state_file).map_err(|e| TrainError::io(&state_file, e))?;
    let state: LoopState = serde_json::from_str(&text).map_err(|e| {
        TrainError::Invalid(format!("{}: not a flowtune loop state: {e}", state_file.display()))
    })?;
    let (block_weights, block_states) = blocks_in(dir)?;
    match (model.adapters().is_some(), dir.join(ADAPTERS).exists()) {
        (true, true) => model.load_lora(&dir.join(ADAPTERS))?,
        (false, false) => model.load_weights_file(&dir.join(WEIGHTS), &block_weights)?,
        (lora, _) => {
            return Err(TrainError::Invalid(format!(
                "{}: this checkpoint holds {}, but model.finetune is {}",
                dir.display(),
                if lora { "full transformer weights" } else { "LoRA adapters" },
                if lora { "lora" } else { "full" }
            )))
        }
    }
    let sharded = model.sharded().filter(|s| s.trains());
    // Rank 0's file, then the shares of a sharded optimizer's other ranks, if any; a model
    // that is not sharded (now) also takes the blocks' states whole.
    let mut saved: BTreeMap<String, Tensor> =
        Tensor::read_safetensors(dir.join(OPTIMIZER))?.into_iter().collect();
    let ranks = (1..).map(|rank| dir.join(rank_file(rank))).take_while(|f| f.exists());
    let whole_blocks = if sharded.is_none() { block_states.clone() } else { vec![] };
    for file in ranks.chain(whole_blocks) {
        saved.extend(Tensor::read_safetensors(&file)?);
    }
    let scope = parts.scope();
    optimizer.load_state_tensors(&saved, &scope).map_err(|e| {
        TrainError::Invalid(format!(
            "{}: {e} in {OPTIMIZER} or its other ranks' files",
            dir.display()
        ))
    })?;
    let _guard = tch::no_grad_guard();
    if let Some(blocks) = sharded {
        for block in blocks.blocks() {
            // This block's own file; a checkpoint without them (written whole) has it in `saved`.
            let state_file = block_files(dir, &block).1;
            let own;
            let named = if state_file.exists() {
                own = Tensor::read_safetensors(&state_file)?.into_iter().collect();
                &own
            } else {
                &saved
            };
            let slice = |prefix: &str| blocks.reshard_block(&block, &prefixed(named, prefix));
            for (prefix, moments) in optimizer.moments() {
                let t = slice(prefix).ok_or_else(|| {
                    TrainError::Invalid(format!(
                        "{}: no {prefix} for {block}'s weights in {} or {OPTIMIZER}",
                        dir.display(),
                        state_file.display()
                    ))
                })?;
                moments[&block].shallow_clone().copy_(&t);
            }
            // A checkpoint of a model in f32, or without masters, leaves the masters at the
            // weights; one without a shadow starts it at them.
            let master = &blocks.masters()[&block];
            if let Some(t) = slice("master") {
                master.shallow_clone().copy_(&t);
            }
            for shadow in &parts.shadows {
                let value = slice(shadow.name).unwrap_or_else(|| master.shallow_clone());
                shadow.shadow[&block].shallow_clone().copy_(&value);
            }
        }
    }
    let others =
        parts.shadows.iter().map(|s| *s as &dyn Stateful).chain(parts.others.iter().copied());
    for part in others {
        part.load_state_tensors(&saved, &scope)
            .map_err(|e| TrainError::Invalid(format!("{}: {e} in {OPTIMIZER}", dir.display())))?;
    }
    Ok(state)
}
