//! The reference policy of the KL term and of the DPO and NFT losses: the base model under LoRA
//! (the same network with its adapters switched off), a frozen copy of the starting transformer
//! under full fine-tuning.

use flowtune_config::{Finetune, Recipe};
use flowtune_models::sd3::{Dtypes, Sd3Pipeline, Sd3Transformer};
use tch::Device;

use crate::TrainError;

/// Where reference forwards run.
pub(crate) enum Reference {
    /// The trained model with its adapters off.
    AdaptersOff,
    /// A frozen copy of the starting weights.
    Frozen(Box<Sd3Transformer>),
}

impl Reference {
    /// The reference for `recipe`, or none when its algorithm and settings never ask for one.
    pub fn for_recipe(
        recipe: &Recipe,
        pipe: &Sd3Pipeline,
        needed: bool,
        device: Device,
        dtypes: Dtypes,
    ) -> Result<Option<Self>, TrainError> {
        if !needed {
            return Ok(None);
        }
        if recipe.model.finetune == Finetune::Lora {
            return Ok(Some(Self::AdaptersOff));
        }
        let dir = pipe.dir.component("transformer", &["SD3Transformer2DModel"])?;
        let mut copy = Sd3Transformer::load(&dir, device, dtypes.transformer, None)?;
        copy.store.freeze();
        Ok(Some(Self::Frozen(Box::new(copy))))
    }

    /// Runs `f` on the reference network (`model` with adapters off, or the frozen copy).
    pub fn run<T>(&self, model: &Sd3Transformer, f: impl FnOnce(&Sd3Transformer) -> T) -> T {
        match self {
            Self::AdaptersOff => {
                model.set_adapters_enabled(false);
                let out = f(model);
                model.set_adapters_enabled(true);
                out
            }
            Self::Frozen(copy) => f(copy),
        }
    }
}
