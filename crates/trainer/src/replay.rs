//! Replaying a rollout's recorded SDE steps with another set of weights (the old policy, the
//! reference, a teacher, an anchor): the log-probabilities and transition means each step would
//! have had under them.

use flowtune_models::Denoiser;
use flowtune_rollout::{Engine, RolloutBatch, Rows};
use flowtune_sampling::StepOutput;
use tch::Tensor;

use crate::TrainError;

/// Old-policy quantities of every (row, window step): log-probs and transition means.
pub(crate) struct OldPolicy {
    pub log_probs: Tensor,
    pub means: Option<Tensor>,
    pub std: Option<Tensor>,
    pub sqrt_dt: Option<Tensor>,
}

/// Replays every window step of all rows with `model` without gradient.
pub(crate) fn replay_all<D: Denoiser + ?Sized>(
    engine: &Engine<'_>,
    model: &D,
    batch: &RolloutBatch,
    rows: &Rows,
    w: i64,
    keep_means: bool,
) -> Result<OldPolicy, TrainError> {
    tch::no_grad(|| {
        let (mut lp, mut means, mut std, mut dt) = (vec![], vec![], vec![], vec![]);
        // `rollout.batch_size` rows at a time, as the rollout ran them: the same matmuls give the
        // same numbers (and a rank's share of a step is not one oversized batch).
        let n = rows.len();
        let size = match engine.sampler.batch_size {
            0 => n,
            b => b,
        };
        for j in 0..w {
            let outs = (0..n)
                .step_by(size.max(1))
                .map(|a| engine.replay_with(model, batch, &rows.narrow(a, size.min(n - a)), j))
                .collect::<Result<Vec<_>, _>>()?;
            let cat = |f: &dyn Fn(&StepOutput) -> Tensor| {
                Tensor::cat(&outs.iter().map(f).collect::<Vec<_>>(), 0)
            };
            lp.push(cat(&|o| o.log_prob.shallow_clone()));
            if keep_means {
                means.push(cat(&|o| o.prev_sample_mean.shallow_clone()));
                std.push(cat(&|o| o.std_dev_t.reshape([-1])));
                dt.push(cat(&|o| o.sqrt_dt.reshape([-1])));
            }
        }
        let stack = |v: Vec<Tensor>| (!v.is_empty()).then(|| Tensor::stack(&v, 1));
        Ok(OldPolicy {
            log_probs: Tensor::stack(&lp, 1),
            means: stack(means),
            std: stack(std),
            sqrt_dt: stack(dt),
        })
    })
}
