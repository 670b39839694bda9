//! What every step of a run reads — the recipe, the rollout engine (and through it the pipeline),
//! the reference policy, the scorers, the progress bar — and where its training data comes from.

use flowtune_config::Recipe;
use flowtune_data::{PromptDataset, PromptLoader};
use flowtune_rewards::Weighted;
use flowtune_rollout::Engine;

use crate::preference::PairSource;
use crate::reference::Reference;
use crate::TrainError;

/// The read-only state of a run.
pub(crate) struct Run<'a> {
    pub recipe: &'a Recipe,
    pub engine: Engine<'a>,
    /// The reference policy, when the algorithm or the KL term needs one.
    pub reference: Option<Reference>,
    pub scorers: Vec<Weighted>,
    pub bar: indicatif::ProgressBar,
}

impl Run<'_> {
    /// Shows what the step is doing now beside the progress bar.
    pub fn status(&self, what: &'static str) {
        self.bar.set_message(what);
    }
}

/// Where a step's training data comes from.
pub(crate) enum Source {
    /// Prompts, sampled `rollout.n` times each and scored.
    Prompts(PromptLoader),
    /// Offline preference pairs (DPO).
    Pairs(PairSource),
}

impl Source {
    /// The data source `recipe` asks for: offline pairs with `data.preference_files`, else prompts.
    pub fn for_recipe(recipe: &Recipe) -> Result<Self, TrainError> {
        let d = &recipe.data;
        let configure = |mut loader: PromptLoader| {
            loader.shuffle = d.shuffle;
            loader.drop_last = d.drop_last;
            loader
        };
        if !d.preference_files.is_empty() {
            let mut pairs = vec![];
            for f in &d.preference_files {
                pairs.extend(flowtune_data::load_pairs(f)?);
            }
            let prompts = flowtune_data::pair_prompts(&pairs);
            let loader = PromptLoader::new(prompts, d.prompts_per_step, 1, recipe.seed)?;
            return Ok(Self::Pairs(PairSource::new(pairs, configure(loader))));
        }
        if d.train_files.is_empty() {
            return Err(TrainError::Invalid(
                "data.train_files is empty; give at least one prompt file".into(),
            ));
        }
        let mut records = vec![];
        for f in &d.train_files {
            records.extend(PromptDataset::load(f)?.records);
        }
        let loader = PromptLoader::new(
            PromptDataset { records },
            d.prompts_per_step,
            recipe.rollout.n,
            recipe.seed,
        )?;
        Ok(Self::Prompts(configure(loader)))
    }

    /// The seeded loader whose state checkpoints keep.
    pub fn loader(&mut self) -> &mut PromptLoader {
        match self {
            Self::Prompts(l) => l,
            Self::Pairs(p) => &mut p.loader,
        }
    }
}
