//! Checkpoints: `checkpoints/step_NNNNNN/` with the adapters (diffusers/PEFT layout) or, under full
//! fine-tuning, the transformer's weights, the optimizer state (with the EMA and DiffusionNFT's old
//! policy) and the loop state. Written into a
//! temporary directory and renamed, so a crash mid-write leaves the previous checkpoint as the
//! newest complete one. In a job, rank 0 writes it; under a sharded optimizer each rank adds its
//! share of the moments (`optimizer.rank<R>.safetensors`), stored by parameter name, so a job with
//! another number of ranks resumes from it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use flowtune_data::LoaderState;
use flowtune_models::shard::ShardedBlocks;
use flowtune_models::TrainableDenoiser;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::dist::Comm;
use crate::optim::Ema;
use crate::update::Learner;
use crate::TrainError;

/// The loop state saved beside the weights.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LoopState {
    /// Training steps completed.
    pub step: u64,
    pub loader: LoaderState,
    pub optimizer_steps: i64,
    /// The step's metric line as known before the save (without the save's own timings), so a run
    /// killed between the save and the log line still has its line restored on resume.
    #[serde(default)]
    pub metrics: serde_json::Value,
    /// GARDO's gate and anchor-reset state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gardo: Option<crate::gardo::GardoState>,
}

const ADAPTERS: &str = "adapters.safetensors";
/// The transformer's weights, under full fine-tuning.
const WEIGHTS: &str = "transformer.safetensors";
const OPTIMIZER: &str = "optimizer.safetensors";
const STATE: &str = "state.json";

/// This rank's share of the optimizer state under a sharded optimizer.
fn rank_file(rank: usize) -> String {
    format!("optimizer.rank{rank}.safetensors")
}

/// Writes a checkpoint for `state.step` and keeps the newest `keep`; every rank of a job calls it.
pub(crate) fn save(
    root: &Path,
    model: &dyn TrainableDenoiser,
    learner: &Learner,
    state: &LoopState,
    keep: usize,
    comm: &Comm,
) -> Result<PathBuf, TrainError> {
    let optimizer = &learner.optimizer;
    let dir = root.join(format!("step_{:06}", state.step));
    let tmp = root.join(format!(".step_{:06}.tmp", state.step));
    if comm.is_main() {
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| TrainError::io(&tmp, e))?;
    }
    comm.barrier()?;
    // Trained sharded blocks: gathered from every rank and saved by weight name, as unsharded.
    let blocks = match model.sharded().filter(|s| s.trains()) {
        Some(blocks) => Some(gather_blocks(blocks, model, learner)?),
        None => None,
    };
    let moments = |named: &mut Vec<(String, Tensor)>| {
        for (name, t) in optimizer.exp_avg.iter().filter(|(n, _)| !optimizer.local.contains(*n)) {
            named.push((format!("exp_avg.{name}"), t.shallow_clone()));
            named.push((format!("exp_avg_sq.{name}"), optimizer.exp_avg_sq[name].shallow_clone()));
        }
        for (name, t) in &optimizer.master {
            named.push((format!("master.{name}"), t.shallow_clone()));
        }
    };
    if !comm.is_main() {
        if optimizer.owners.is_some() {
            let mut named = vec![];
            moments(&mut named);
            Tensor::write_safetensors(&named, tmp.join(rank_file(comm.rank())))?;
        }
        comm.barrier()?;
        comm.barrier()?;
        return Ok(dir);
    }
    let mut named: Vec<(String, Tensor)> = vec![];
    match (model.adapters().is_some(), blocks) {
        (true, _) => model.save_lora(&tmp.join(ADAPTERS))?,
        (false, None) => model.save_weights(&tmp.join(WEIGHTS))?,
        (false, Some((weights, state))) => {
            Tensor::write_safetensors(&weights, tmp.join(WEIGHTS))?;
            named.extend(state);
        }
    }
    moments(&mut named);
    for (prefix, shadow) in shadows(learner) {
        for (name, t) in shadow.shadow.iter().filter(|(n, _)| !optimizer.local.contains(*n)) {
            named.push((format!("{prefix}.{name}"), t.shallow_clone()));
        }
    }
    Tensor::write_safetensors(&named, tmp.join(OPTIMIZER))?;
    let text = serde_json::to_string_pretty(state).expect("state is JSON");
    std::fs::write(tmp.join(STATE), text).map_err(|e| TrainError::io(&tmp, e))?;
    // Every rank's files on disk before the rename makes the checkpoint visible.
    comm.barrier()?;
    for entry in std::fs::read_dir(&tmp).map_err(|e| TrainError::io(&tmp, e))?.flatten() {
        std::fs::File::open(entry.path())
            .and_then(|f| f.sync_all())
            .map_err(|e| TrainError::io(&entry.path(), e))?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).map_err(|e| TrainError::io(&dir, e))?;
    let _ = std::fs::File::open(root).and_then(|d| d.sync_all());
    // Keep the newest `keep` up to this step; drop those after it (the abandoned future of a run
    // resumed from an older checkpoint) and crash leftovers.
    let older = complete_checkpoints(root)?.into_iter().rev().filter(|(s, _)| *s != state.step);
    for (i, (step, path)) in older.enumerate() {
        if step > state.step || i + 1 >= keep {
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

/// The weights of a model with trained sharded blocks, and the blocks' Adam moments, f32
/// masters (of a model in another dtype) and shadows, gathered from every rank by weight name.
type Gathered = (Vec<(String, Tensor)>, Vec<(String, Tensor)>);

fn gather_blocks(
    blocks: &ShardedBlocks,
    model: &dyn TrainableDenoiser,
    learner: &Learner,
) -> Result<Gathered, TrainError> {
    let optimizer = &learner.optimizer;
    let slices = |m: &BTreeMap<String, Tensor>| -> BTreeMap<String, Tensor> {
        let local = m.iter().filter(|(n, _)| optimizer.local.contains(*n));
        local.map(|(n, t)| (n.clone(), t.shallow_clone())).collect()
    };
    let mut parts = vec![("exp_avg", slices(&optimizer.exp_avg))];
    parts.push(("exp_avg_sq", slices(&optimizer.exp_avg_sq)));
    if blocks.kind() != Kind::Float {
        parts.push(("master", blocks.masters()));
    }
    parts.extend(shadows(learner).map(|(prefix, shadow)| (prefix, slices(&shadow.shadow))));
    let mut state = vec![];
    for (prefix, part) in parts {
        for (name, t) in blocks.unshard(&part, Kind::Float)? {
            state.push((format!("{prefix}.{name}"), t.to_device(Device::Cpu)));
        }
    }
    Ok((model.named_weights()?, state))
}

/// This rank's slices of the blocks' entries `prefix.<weight>` of `saved`, by block.
fn block_slices(
    blocks: &ShardedBlocks,
    saved: &BTreeMap<String, Tensor>,
    prefix: &str,
) -> Option<BTreeMap<String, Tensor>> {
    let named = saved.iter().filter_map(|(n, t)| {
        Some((n.strip_prefix(prefix)?.strip_prefix('.')?.to_string(), t.shallow_clone()))
    });
    blocks.reshard(&named.collect())
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

/// The learner's copies of the weights, by the prefix they are saved under: the EMA, and
/// DiffusionNFT's old policy.
fn shadows(learner: &Learner) -> impl Iterator<Item = (&'static str, &Ema)> {
    [("ema", learner.ema.as_ref()), ("old", learner.old.as_ref())]
        .into_iter()
        .filter_map(|(prefix, s)| s.map(|s| (prefix, s)))
}

/// Restores adapters, optimizer state, the learner's shadows and the loop state from `dir`.
pub(crate) fn load(
    dir: &Path,
    model: &mut dyn TrainableDenoiser,
    learner: &mut Learner,
) -> Result<LoopState, TrainError> {
    let optimizer = &mut learner.optimizer;
    let state_file = dir.join(STATE);
    let text = std::fs::read_to_string(&state_file).map_err(|e| TrainError::io(&state_file, e))?;
    let state: LoopState = serde_json::from_str(&text).map_err(|e| {
        TrainError::Invalid(format!("{}: not a flowtune loop state: {e}", state_file.display()))
    })?;
    match (model.adapters().is_some(), dir.join(ADAPTERS).exists()) {
        (true, true) => model.load_lora(&dir.join(ADAPTERS))?,
        (false, false) => model.load_weights_file(&dir.join(WEIGHTS))?,
        (lora, _) => {
            return Err(TrainError::Invalid(format!(
                "{}: this checkpoint holds {}, but model.finetune is {}",
                dir.display(),
                if lora { "full transformer weights" } else { "LoRA adapters" },
                if lora { "lora" } else { "full" }
            )))
        }
    }
    // Rank 0's file, then the shares of a sharded optimizer's other ranks, if any.
    let mut saved: BTreeMap<String, Tensor> =
        Tensor::read_safetensors(dir.join(OPTIMIZER))?.into_iter().collect();
    for rank in 1.. {
        let file = dir.join(rank_file(rank));
        if !file.exists() {
            break;
        }
        saved.extend(Tensor::read_safetensors(&file)?);
    }
    let _guard = tch::no_grad_guard();
    for (name, m) in optimizer.exp_avg.iter().filter(|(n, _)| !optimizer.local.contains(*n)) {
        let (sm, sv) =
            (saved.get(&format!("exp_avg.{name}")), saved.get(&format!("exp_avg_sq.{name}")));
        let (Some(sm), Some(sv)) = (sm, sv) else {
            return Err(TrainError::Invalid(format!(
                "{}: no optimizer state for {name} in {OPTIMIZER} or its other ranks' files",
                dir.display()
            )));
        };
        m.shallow_clone().copy_(sm);
        optimizer.exp_avg_sq[name].shallow_clone().copy_(sv);
    }
    for (name, master) in &optimizer.master {
        // A checkpoint written without master copies starts them at the loaded weights.
        let value = saved.get(&format!("master.{name}")).unwrap_or(&optimizer.params[name]);
        master.shallow_clone().copy_(value);
    }
    optimizer.steps = state.optimizer_steps;
    if let Some(blocks) = model.sharded().filter(|s| s.trains()) {
        let missing = |what: &str| {
            TrainError::Invalid(format!(
                "{}: no {what} for a sharded block's weight in {OPTIMIZER}",
                dir.display()
            ))
        };
        for (prefix, moments) in
            [("exp_avg", &optimizer.exp_avg), ("exp_avg_sq", &optimizer.exp_avg_sq)]
        {
            for (block, t) in block_slices(blocks, &saved, prefix).ok_or_else(|| missing(prefix))? {
                moments[&block].shallow_clone().copy_(&t);
            }
        }
        // A checkpoint of a model in f32, or without masters, leaves the masters at the weights.
        if let Some(masters) = block_slices(blocks, &saved, "master") {
            for (block, master) in blocks.masters() {
                master.shallow_clone().copy_(&masters[&block]);
            }
        }
    }
    learner.gardo = state.gardo.clone();
    for (prefix, shadow) in shadows(learner) {
        if let Some(blocks) = model.sharded().filter(|s| s.trains()) {
            let slices = block_slices(blocks, &saved, prefix).unwrap_or_else(|| blocks.masters());
            for (block, t) in slices {
                shadow.shadow[&block].shallow_clone().copy_(&t);
            }
        }
        for (name, value) in
            shadow.shadow.iter().filter(|(n, _)| !learner.optimizer.local.contains(*n))
        {
            // A checkpoint from a run without this shadow starts it at the loaded weights.
            let saved = saved.get(&format!("{prefix}.{name}"));
            value.shallow_clone().copy_(saved.unwrap_or(&learner.optimizer.params[name]));
        }
    }
    Ok(state)
}
