//! A rollout rank's loop: take where the run starts, then step by step sample and score its share
//! of the step's prompts with the weights it was last handed, hand the samples over and take the
//! next weights, until the last step or until the training ranks say stop.

use std::collections::BTreeMap;
use std::path::PathBuf;

use flowtune_config::Recipe;
use flowtune_data::PromptRecord;
use flowtune_models::FlowPipeline;
use flowtune_rewards::Weighted;
use flowtune_rollout::Engine;
use tch::Tensor;

use super::wire::{self, Part};
use super::Control;
use crate::collect::{local_rows, sample, Sampled};
use crate::dist::{Comm, Handoff};
use crate::layout::Layout;
use crate::run::Run;
use crate::source::Source;
use crate::stateful::Stateful;
use crate::{TrainError, TrainSummary};

/// A rollout rank, loaded and ready to sample.
pub(crate) struct Sampler<'r> {
    pub recipe: &'r Recipe,
    pub comm: Comm,
    pub pipe: Box<dyn FlowPipeline>,
    pub latent_shape: Vec<i64>,
    pub source: Source,
    pub scorers: Vec<Weighted>,
    pub layout: Layout,
}

impl Sampler<'_> {
    /// Samples until the training ranks are done.
    pub fn serve(self) -> Result<TrainSummary, TrainError> {
        let Sampler { recipe, comm, pipe, latent_shape, mut source, scorers, layout } = self;
        let run = Run {
            recipe,
            engine: Engine::new(pipe.as_ref(), &recipe.rollout, latent_shape, recipe.seed)?,
            reference: None,
            scorers,
            bar: indicatif::ProgressBar::hidden(),
            comm,
            layout,
        };
        // A signal stops the training ranks after their step; they then stop this rank.
        let _signals = crate::signals::StopRequest::listen(false);
        let handoff = run.comm.handoff().expect("a rollout rank");
        let params = pipe.denoiser().trainable_parameters();
        let Control::Start { done, loader } = handoff.receive_weights(&params)? else {
            return Err(unexpected("a start"));
        };
        let state = serde_json::from_str(&loader)
            .map_err(|e| TrainError::Distributed(format!("the data loader's state: {e}")))?;
        source.restore(&state)?;
        let loader = crate::algorithms::prompts(&mut source)?;
        let lag = recipe.trainer.off_policy_lag;
        let mut steps_run = 0;
        for number in done + 1..=recipe.trainer.total_steps {
            if lag == 0 && !go(handoff, &params)? {
                break;
            }
            let rows = loader.next_step();
            let records: Vec<&PromptRecord> = rows.iter().map(|r| loader.record(r)).collect();
            let local = local_rows(&run, rows.len());
            let uids = rows[local.clone()].iter().map(|r| r.uid.clone()).collect();
            let Sampled { batch, scores, gen_s, reward_s, flops } =
                sample(&run, &records, local, number)?;
            let part = Part {
                step: number,
                uids,
                scores,
                windows: batch.windows.clone(),
                lengths: batch.text.lengths.clone(),
                negative_lengths: batch.negative.as_ref().and_then(|n| n.lengths.clone()),
                image_sizes: wire::sizes(&batch.images),
                audio_rate: wire::audio_rate(&batch.audio),
                gen_s,
                reward_s,
                flops,
            };
            handoff.send_samples(&part, &wire::tensors(&batch))?;
            steps_run += 1;
            if lag > 0 && !go(handoff, &params)? {
                break;
            }
        }
        Ok(TrainSummary {
            metrics: vec![],
            export: PathBuf::new(),
            steps_run,
            rank: None,
            stopped: None,
        })
    }
}

/// Takes the next weights into `params`; false when the training ranks stopped.
fn go(handoff: &Handoff, params: &BTreeMap<String, Tensor>) -> Result<bool, TrainError> {
    match handoff.receive_weights(params)? {
        Control::Go => Ok(true),
        Control::Stop => Ok(false),
        Control::Start { .. } => Err(unexpected("the next weights")),
    }
}

fn unexpected(what: &str) -> TrainError {
    TrainError::Distributed(format!("a rollout rank expected {what} from the training ranks"))
}
