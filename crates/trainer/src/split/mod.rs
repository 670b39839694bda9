//! A job split into rollout and training ranks (`trainer.rollout_ranks: K`): the first K ranks
//! only sample and score, the others only train. With `trainer.off_policy_lag: 1`, step k goes:
//!
//! - the rollout ranks sample step k's prompts (each its share of the prompt groups, seeded by the
//!   row's place in the whole step) with the weights after step k − 2, and score them, while the
//!   training ranks update on step k − 1's samples;
//! - then each rollout rank hands its share to every training rank, and the first training rank
//!   hands the weights after step k − 1 to the rollout ranks (the LoRA adapters, or every trained
//!   weight, one tensor at a time into the rollout rank's model, so no rank holds a second copy).
//!
//! With lag 0 the rollout ranks take the weights first and the training ranks wait for the
//! samples: the synchronous run, on other ranks. Each training rank keeps its own rows of the
//! shares (with every row's scores), so advantages, the update and sharding inside the training
//! ranks are those of a job of the training ranks alone, and the run is the one a single process
//! makes with the same lag ([`crate::collect::collect_behaviour`]). The first training
//! rank writes everything and keeps, under a lag, the copy the rollout ranks sample with: its
//! checkpoints are a single process's, which any split resumes. The rollout ranks read no
//! checkpoint: the first message says where the run starts, with the data loader's place and the
//! weights to sample with.

mod sampler;
mod wire;

use std::collections::BTreeMap;
use std::time::Instant;

use flowtune_data::{PromptLoader, PromptRecord};
use flowtune_rewards::ScoredBatch;
use serde::{Deserialize, Serialize};

use crate::collect::{finish, local_rows, Collected};
use crate::run::Run;
use crate::source::Source;
use crate::stateful::Stateful;
use crate::step::Step;
use crate::update::Learner;
use crate::TrainError;
use wire::Part;

pub(crate) use sampler::Sampler;

/// What the first training rank tells the rollout ranks, with the weights to sample with.
#[derive(Serialize, Deserialize)]
enum Control {
    /// The run goes on after step `done`, the data loader at `loader` (its JSON state).
    Start { done: u64, loader: String },
    /// Sample the next step.
    Go,
    /// The training ranks stopped before the last step.
    Stop,
}

/// Tells the rollout ranks where the run starts (after step `done`) and, under a lag, the weights
/// they sample its first step with (the learner's lagged copy).
pub(crate) fn start(
    run: &Run<'_>,
    learner: &Learner,
    source: &Source,
    done: u64,
) -> Result<(), TrainError> {
    let Some(handoff) = run.comm.handoff() else { return Ok(()) };
    let weights = match &learner.lagged {
        Some(lagged) => lagged.shadow.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect(),
        None => BTreeMap::new(),
    };
    let loader = source.state().to_string();
    handoff.send_weights(&Control::Start { done, loader }, &weights)
}

/// A training rank's step `step`: takes the rollout ranks' samples for the loader's next prompts
/// and hands them the trained weights (before the samples without a lag, after them with one,
/// the lagged copy then taking the weights); keeps this rank's rows of the step. Times
/// the wait as `rollout_wait`, and `gen` and `reward` as the rollout ranks took them.
pub(crate) fn collect_handed(
    run: &Run<'_>,
    learner: &mut Learner,
    loader: &mut PromptLoader,
    step: &mut Step,
) -> Result<Collected, TrainError> {
    let handoff = run.comm.handoff().expect("a split job");
    let rows = loader.next_step();
    let records: Vec<&PromptRecord> = rows.iter().map(|r| loader.record(r)).collect();
    let params = &learner.optimizer.params;
    let wait = Instant::now();
    if learner.lagged.is_none() {
        handoff.send_weights(&Control::Go, params)?;
    }
    let parts = handoff.receive_samples::<Part>()?;
    if let Some(lagged) = learner.lagged.as_mut() {
        handoff.send_weights(&Control::Go, params)?;
        lagged.update(params);
    }
    step.timers.add("rollout_wait", wait.elapsed().as_secs_f64());
    let device = run.comm.device();
    let local = local_rows(run, rows.len());
    // This rank's rows of each share, copied so that the rest of the step is freed.
    let (mut mine, mut scores, mut uids) = (vec![], vec![], vec![]);
    let (mut gen, mut reward, mut flops) = (0f64, 0f64, 0.0);
    let ranks = parts.len() as f64;
    for (part, tensors) in parts {
        if part.step != step.number {
            return Err(TrainError::Distributed(format!(
                "a rollout rank handed over samples of step {} at step {}",
                part.step, step.number
            )));
        }
        let here = uids.len()..uids.len() + part.uids.len();
        let (start, end) = (here.start.max(local.start), here.end.min(local.end));
        if start < end {
            let share = wire::batch(&part, tensors, device)?;
            mine.push(wire::rows(&share, &(start - here.start..end - here.start)));
        }
        (gen, reward, flops) = (gen.max(part.gen_s), reward.max(part.reward_s), flops + part.flops);
        uids.extend(part.uids);
        scores.push(part.scores);
    }
    if !uids.iter().eq(rows.iter().map(|r| &r.uid)) {
        return Err(TrainError::Distributed(format!(
            "step {}: the rollout ranks sampled other prompts than the training ranks' loader holds",
            step.number
        )));
    }
    step.timers.add("gen", gen);
    step.timers.add("reward", reward);
    step.metrics.insert("perf/tflops/rollout".into(), flops / ranks / gen / 1e12);
    let batch = wire::stack(mine)?;
    finish(run, &rows, &records, batch, local, ScoredBatch::concat(scores), step)
}

/// After the training ranks stopped at step `done` before the last step: takes the samples the
/// rollout ranks drew meanwhile (under a lag) and tells them to stop.
pub(crate) fn release(run: &Run<'_>, done: u64) -> Result<(), TrainError> {
    let Some(handoff) = run.comm.handoff() else { return Ok(()) };
    if done >= run.recipe.trainer.total_steps {
        return Ok(());
    }
    if run.recipe.trainer.off_policy_lag > 0 {
        handoff.receive_samples::<Part>()?;
    }
    handoff.send_weights(&Control::Stop, &BTreeMap::new())
}
