//! Where a step's training data comes from: prompts to sample and score, or offline preference
//! pairs.

use flowtune_config::Recipe;
use flowtune_data::{PromptDataset, PromptLoader};

use crate::preference::PairSource;
use crate::TrainError;

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
