//! Diffusion-DPO steps. Online: the best and worst sample of each prompt group form a (chosen,
//! rejected) pair. Offline: pairs come from `data.preference_files`, their images encoded once (the
//! VAE posterior mean, or the pixels of a pixel-space pipeline) and cached. Either way each pair
//! shares one noise and one logit-normal noise level, and the reference is the base model.

use std::collections::BTreeMap;
use std::time::Instant;

use flowtune_models::{velocity_at_sigma, TextConditioning};
use flowtune_objectives::losses::{dpo_loss, DpoBatch};
use flowtune_rollout::encode_rows;
use flowtune_sampling::{per_row, row_seed, upload, SampleRng};
use tch::{Device, Tensor};

use super::Algorithm;
use crate::collect::{collect, Collected};
use crate::run::Run;
use crate::seeds::DPO_SALT;
use crate::source::{PairSource, Source};
use crate::stateful::Stateful;
use crate::step::Step;
use crate::update::{optimize, Batching, Learner, SlotLoss};
use crate::TrainError;

/// Diffusion-DPO, online on best/worst pairs of each group or offline on a pairs dataset.
pub(crate) struct Dpo;

/// Nothing carries over from step to step.
impl Stateful for Dpo {}

impl Algorithm for Dpo {
    fn step(
        &mut self,
        run: &Run<'_>,
        learner: &mut Learner,
        source: &mut Source,
        step: &mut Step,
    ) -> Result<usize, TrainError> {
        match source {
            Source::Pairs(pairs) => {
                run.status("update");
                offline_step(run, learner, pairs, step)?;
                Ok(2 * run.recipe.data.prompts_per_step)
            }
            Source::Prompts(loader) => {
                let collected = collect(run, loader, step)?;
                run.status("update");
                online_step(run, learner, &collected, step)?;
                Ok(collected.batch.images.len())
            }
        }
    }
}

/// Positions `(chosen, rejected)` of the best and worst sample of each prompt group (by uid) whose
/// best reward beats its worst; groups of one and all-equal groups give no pair.
pub(crate) fn best_worst(rewards: &[f32], uids: &[String]) -> Vec<(usize, usize)> {
    let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (row, uid) in uids.iter().enumerate() {
        groups.entry(uid.as_str()).or_default().push(row);
    }
    let mut pairs = vec![];
    for members in groups.values().filter(|members| members.len() >= 2) {
        let by_reward =
            |left: &&usize, right: &&usize| rewards[**left].total_cmp(&rewards[**right]);
        let best = *members.iter().max_by(by_reward).expect("a group has members");
        let worst = *members.iter().min_by(by_reward).expect("a group has members");
        if rewards[best] > rewards[worst] {
            pairs.push((best, worst));
        }
    }
    pairs
}

/// An online DPO step on a scored rollout: pairs over the whole step, each trained by the rank
/// that sampled its group.
fn online_step(
    run: &Run<'_>,
    learner: &mut Learner,
    collected: &Collected,
    step: &mut Step,
) -> Result<(), TrainError> {
    let pairs = best_worst(&collected.rewards, &collected.uids);
    step.metrics.insert("critic/dpo_pairs".into(), pairs.len() as f64);
    if pairs.is_empty() {
        if run.comm.is_main() {
            eprintln!(
                "step {}: no prompt group has two different rewards; no DPO update",
                step.number
            );
        }
        return Ok(());
    }
    let owns = |&(chosen, _): &(usize, usize)| collected.owned.contains(&chosen);
    let owned: Vec<bool> = pairs.iter().map(owns).collect();
    // This rank's batch rows of its pairs, chosen then rejected.
    let rows = &collected.kept.host;
    let row = |position: usize| rows[position - collected.owned.start];
    let order: Vec<i64> = pairs
        .iter()
        .filter(|pair| owns(pair))
        .flat_map(|&(chosen, rejected)| [row(chosen), row(rejected)])
        .collect();
    let index = upload(Tensor::from_slice(&order), collected.kept.device.device());
    let pairs = StepPairs {
        x0: collected.batch.trajectory.final_latents.index_select(0, &index),
        text: collected.batch.text.rows_at(&order),
        owned,
    };
    update(run, learner, &pairs, step)
}

/// An offline DPO step on the next `data.prompts_per_step` pairs of the dataset.
fn offline_step(
    run: &Run<'_>,
    learner: &mut Learner,
    source: &mut PairSource,
    step: &mut Step,
) -> Result<(), TrainError> {
    let timer = Instant::now();
    let rows = source.loader.next_step();
    // This rank encodes and trains its share of the step's pairs.
    let mine = run.comm.share(rows.len());
    let owned: Vec<bool> = (0..rows.len()).map(|pair| mine.contains(&pair)).collect();
    let mut latents = vec![];
    for row in &rows[mine.clone()] {
        latents.push(source.latents(run, row.prompt)?);
    }
    let prompts: Vec<&str> = rows[mine]
        .iter()
        .flat_map(|row| {
            let prompt = source.pairs[row.prompt].prompt.as_str();
            [prompt, prompt]
        })
        .collect();
    let x0 = Tensor::cat(&latents, 0);
    let text = encode_rows(run.engine.pipe, &prompts, &[], &[], None)?;
    step.timers.add("gen", timer.elapsed().as_secs_f64());
    step.metrics.insert("critic/dpo_pairs".into(), rows.len() as f64);
    update(run, learner, &StepPairs { x0, text, owned }, step)
}

/// The step's pairs, of which this rank holds those `owned` says: their clean latents and text
/// rows interleaved `[chosen, rejected, …]`, in pair order.
struct StepPairs {
    x0: Tensor,
    text: TextConditioning,
    owned: Vec<bool>,
}

/// The DPO update of the step's pairs.
fn update(
    run: &Run<'_>,
    learner: &mut Learner,
    pairs: &StepPairs,
    step: &mut Step,
) -> Result<(), TrainError> {
    let update = crate::perf::ActorUpdate::start();
    let StepPairs { x0, text, owned } = pairs;
    let recipe = run.recipe;
    let model = run.engine.pipe.denoiser();
    let reference = run.reference.as_ref().expect("dpo always has a reference");
    let pair_count = owned.len() as i64;
    let device = x0.device();
    // This rank's position of each of its pairs, and their rows in the step-wide noise.
    let mut local = vec![usize::MAX; owned.len()];
    let mut rows = vec![];
    for (pair, _) in owned.iter().enumerate().filter(|(_, owns)| **owns) {
        local[pair] = rows.len() / 2;
        rows.extend([2 * pair as i64, 2 * pair as i64 + 1]);
    }
    let rows = Tensor::from_slice(&rows).to_device(device);
    // One noise and one noise level per pair of the step, from the run's seed and the step.
    let mut rng = SampleRng::new(row_seed(recipe.seed ^ DPO_SALT, step.number, 0));
    let uniforms = Vec::<f32>::try_from(rng.normal(&[pair_count], Device::Cpu).sigmoid())?;
    let sigma: Vec<f32> = uniforms
        .iter()
        .flat_map(|&uniform| {
            let sigma = run.engine.pipe.scheduler().training_sigma_at(uniform as f64) as f32;
            [sigma, sigma]
        })
        .collect();
    let sigma = Tensor::from_slice(&sigma).to_device(device).index_select(0, &rows);
    let mut shape = x0.size();
    shape[0] = pair_count;
    let noise = rng.normal(&shape, device).repeat_interleave_self_int(2, 0, None);
    let noise = noise.index_select(0, &rows);
    let sigma_rows = per_row(&sigma, x0);
    let xt: Tensor = &sigma_rows * &noise + (1.0 - &sigma_rows) * x0;
    let trainer = &recipe.trainer;
    let batching = Batching {
        items: owned.len(),
        owned: owned.clone(),
        mini: trainer.ppo_mini_batch_size,
        micro: (trainer.micro_batch_size / 2).max(1),
    };
    step.metrics.extend(optimize(learner, run, batching, step.number, step.lr, |micro, pass| {
        let rows: Vec<i64> = micro
            .iter()
            .map(|&pair| local[pair] as i64)
            .flat_map(|pair| [2 * pair, 2 * pair + 1])
            .collect();
        let idx = upload(Tensor::from_slice(&rows), device);
        let (xt, sigma, text) =
            (xt.index_select(0, &idx), sigma.index_select(0, &idx), text.rows_at(&rows));
        pass.slots(1, |_| {
            let ref_pred = tch::no_grad(|| {
                reference.run(model, |net| velocity_at_sigma(net, &xt, &sigma, &text))
            })?;
            let model_pred = velocity_at_sigma(model, &xt, &sigma, &text)?;
            let output = dpo_loss(
                &DpoBatch {
                    latents: &x0.index_select(0, &idx),
                    noise: &noise.index_select(0, &idx),
                    model_pred: &model_pred,
                    ref_pred: &ref_pred,
                },
                recipe.actor.dpo.beta,
            )?;
            Ok(SlotLoss { what: "dpo".into(), output })
        })
    })?);
    update.finish(&mut step.metrics);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_share_a_prompt_and_the_chosen_scores_higher() {
        let uids: Vec<String> = ["a", "b", "a", "c", "b", "a", "d", "d"].map(String::from).into();
        let rewards = [0.2, 0.9, 0.7, 0.5, 0.1, 0.4, 0.3, 0.3];
        let pairs = best_worst(&rewards, &uids);
        // a: best 2 (0.7), worst 0 (0.2); b: 1 over 4; c alone and d tied give no pair.
        assert_eq!(pairs, [(2, 0), (1, 4)]);
        for (chosen, rejected) in pairs {
            assert_eq!(uids[chosen], uids[rejected]);
            assert!(rewards[chosen] > rewards[rejected]);
        }
    }
}
