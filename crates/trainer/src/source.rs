//! Where a step's training data comes from: prompts to sample and score, or offline preference
//! pairs.

use std::collections::HashMap;

use flowtune_config::Recipe;
use flowtune_data::{PreferencePair, PromptDataset, PromptLoader};
use image::imageops::FilterType;
use tch::Tensor;

use crate::run::Run;
use crate::stateful::Stateful;
use crate::TrainError;

/// Where a step's training data comes from.
pub enum Source {
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
    fn loader(&self) -> &PromptLoader {
        match self {
            Self::Prompts(l) => l,
            Self::Pairs(p) => &p.loader,
        }
    }
}

/// The loader's place (epoch and cursor), so a resumed run goes on with the same prompts.
impl Stateful for Source {
    fn state(&self) -> serde_json::Value {
        serde_json::to_value(self.loader().state).expect("the loader's state is JSON")
    }

    fn restore(&mut self, state: &serde_json::Value) -> Result<(), TrainError> {
        let state = serde_json::from_value(state.clone()).map_err(|e| {
            TrainError::Invalid(format!("a checkpoint's data loader state does not read: {e}"))
        })?;
        match self {
            Self::Prompts(l) => l.state = state,
            Self::Pairs(p) => p.loader.state = state,
        }
        Ok(())
    }
}

/// Offline pairs: the dataset, its seeded loader and the encoded images.
pub struct PairSource {
    pub pairs: Vec<PreferencePair>,
    pub loader: PromptLoader,
    cache: HashMap<usize, Tensor>,
}

impl PairSource {
    pub fn new(pairs: Vec<PreferencePair>, loader: PromptLoader) -> Self {
        Self { pairs, loader, cache: HashMap::new() }
    }

    /// Clean latents (2, C, H, W) of pair `i`: chosen, then rejected.
    pub fn latents(&mut self, run: &Run<'_>, i: usize) -> Result<Tensor, TrainError> {
        if let Some(t) = self.cache.get(&i) {
            return Ok(t.shallow_clone());
        }
        let side = run.recipe.model.resolution as u32;
        let pair = &self.pairs[i];
        let mut bytes = vec![];
        for path in [&pair.chosen, &pair.rejected] {
            let image = image::open(path)
                .map_err(|source| TrainError::Image { path: path.clone(), source })?
                .to_rgb8();
            // Centre square, resized to the training resolution.
            let s = image.width().min(image.height());
            let square = image::imageops::crop_imm(
                &image,
                (image.width() - s) / 2,
                (image.height() - s) / 2,
                s,
                s,
            )
            .to_image();
            bytes.extend(
                image::imageops::resize(&square, side, side, FilterType::Lanczos3).into_raw(),
            );
        }
        let pixels = Tensor::from_slice(&bytes)
            .view([2, side as i64, side as i64, 3])
            .to_device(run.engine.pipe.device());
        let latents = tch::no_grad(|| run.engine.pipe.encode_rgb8(&pixels))?;
        self.cache.insert(i, latents.shallow_clone());
        Ok(latents)
    }
}
