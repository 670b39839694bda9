//! The reference policy of the KL term and of the DPO and NFT losses: the base model under LoRA
//! (the same network with its adapters switched off), a frozen copy of the starting denoiser
//! under full fine-tuning.

use flowtune_config::{Finetune, Recipe};
use flowtune_models::{FlowPipeline, TrainableDenoiser};

use crate::TrainError;

/// Where reference forwards run.
pub(crate) enum Reference {
    /// The trained model with its adapters off.
    AdaptersOff,
    /// A frozen copy of the starting weights.
    Frozen(Box<dyn TrainableDenoiser>),
}

impl Reference {
    /// The reference for `recipe`, or none when its algorithm and settings never ask for one.
    pub fn for_recipe(
        recipe: &Recipe,
        pipe: &dyn FlowPipeline,
        needed: bool,
    ) -> Result<Option<Self>, TrainError> {
        if !needed {
            return Ok(None);
        }
        Ok(Some(match recipe.model.finetune {
            Finetune::Lora => Self::AdaptersOff,
            Finetune::Full => Self::Frozen(pipe.denoiser().frozen_copy()?),
        }))
    }

    /// Runs `f` on the reference network (`model` with adapters off, or the frozen copy).
    pub fn run<'m, T>(
        &'m self,
        model: &'m dyn TrainableDenoiser,
        f: impl FnOnce(&'m dyn TrainableDenoiser) -> T,
    ) -> T {
        match self {
            Self::AdaptersOff => {
                model.set_adapters_enabled(false);
                let out = f(model);
                model.set_adapters_enabled(true);
                out
            }
            Self::Frozen(copy) => f(copy.as_ref()),
        }
    }
}
