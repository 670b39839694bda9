//! What every step of a run reads: the recipe, the rollout engine (and through it the pipeline),
//! the reference policy, the scorers, the progress bar, and this process's place among the ranks
//! and the model's layout over them.

use flowtune_config::Recipe;
use flowtune_rewards::Weighted;
use flowtune_rollout::Engine;

use crate::dist::Comm;
use crate::layout::Layout;
use crate::reference::Reference;

/// The read-only state of a run.
pub struct Run<'a> {
    pub recipe: &'a Recipe,
    pub engine: Engine<'a>,
    /// The reference policy, when the algorithm or the KL term needs one.
    pub(crate) reference: Option<Reference>,
    pub scorers: Vec<Weighted>,
    pub bar: indicatif::ProgressBar,
    pub comm: Comm,
    /// How the model is spread over the ranks.
    pub layout: Layout,
}

impl Run<'_> {
    /// Shows what the step is doing now beside the progress bar.
    pub fn status(&self, what: &'static str) {
        self.bar.set_message(what);
    }

    /// The scorers this rank runs: all of them, or none on a sequence-parallel group's other
    /// ranks (they hold the same samples; the group's first rank's scores are the ones gathered).
    pub fn scorers(&self) -> &[Weighted] {
        if self.comm.leads_group() {
            &self.scorers
        } else {
            &[]
        }
    }

    /// Tells people `line` (above the progress bar); in a job, rank 0 alone speaks.
    pub fn say(&self, line: String) {
        if self.comm.is_main() {
            crate::logging::say(&self.bar, line);
        }
    }
}
