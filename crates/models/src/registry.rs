//! The registry of model families, keyed by `model_index.json`'s `_class_name` as diffusers
//! dispatches: one [`Family`] entry per family, built in or registered at run time.

use std::path::Path;
use std::sync::RwLock;

use tch::{Device, Kind};

use crate::condition_sizes::SizeConditions;
use crate::denoiser::TrainableDenoiser;
use crate::family::{FlowPipeline, PipelineOptions};
use crate::lora::LoraConfig;
use crate::pipeline::PipelineDir;
use crate::ModelError;

/// Loads a pipeline directory of a family.
pub type LoadPipeline =
    fn(&PipelineDir, &PipelineOptions) -> Result<Box<dyn FlowPipeline>, ModelError>;
/// Loads a denoiser component directory (`config.json` + safetensors) on a device, in a dtype,
/// with optional adapters.
pub type LoadDenoiser =
    fn(&Path, Device, Kind, Option<&LoraConfig>) -> Result<Box<dyn TrainableDenoiser>, ModelError>;
/// Writes a small random pipeline of the family from a seed (tests, `make-tiny`).
pub type WriteTiny = fn(&Path, u64) -> Result<(), ModelError>;

/// One model family: how to recognise it and load it.
#[derive(Debug)]
pub struct Family {
    /// Short name (`sd3`), for `flowtune list`, messages and tests.
    pub name: &'static str,
    /// `model_index.json` `_class_name`s it loads.
    pub pipeline_classes: &'static [&'static str],
    /// Pipeline classes of the family's models that it does not load, each with the reason
    /// given to whoever points a recipe at one.
    pub refused_classes: &'static [(&'static str, &'static str)],
    /// The denoiser component's `_class_name` (in its `config.json`).
    pub denoiser_class: &'static str,
    /// The layers a LoRA adapts when nothing names them (`flowtune bench transformer`); recipes
    /// name theirs in `model.lora.target_modules`.
    pub lora_targets: &'static [&'static str],
    /// Its components as (folder, what it holds), for `flowtune list`.
    pub components: &'static [(&'static str, &'static str)],
    pub load: LoadPipeline,
    pub load_denoiser: LoadDenoiser,
    pub write_tiny: WriteTiny,
    /// What a row's condition pictures add to a sample's sequence, for `flowtune plan`
    /// ([`crate::condition_sizes::no_tokens`] where they add none).
    pub condition_sizes: SizeConditions,
}

/// The families that ship with flowtune.
const BUILT_IN: &[&Family] = &[
    &crate::sd3::FAMILY,
    &crate::qwen_image::FAMILY,
    &crate::z_image::FAMILY,
    &crate::flux::FAMILY,
    &crate::flux2::FAMILY,
    &crate::wan::FAMILY,
    &crate::qwen_image21::FAMILY,
    &crate::ltx2::FAMILY,
];

/// Families registered at run time (plug-ins, tests).
static REGISTERED: RwLock<Vec<&'static Family>> = RwLock::new(Vec::new());

/// Adds a family; a later registration of the same pipeline class takes precedence.
pub fn register(family: &'static Family) {
    REGISTERED.write().expect("registry lock").push(family);
}

/// Every known family: built in first, then registered ones.
pub fn families() -> Vec<&'static Family> {
    let registered = REGISTERED.read().expect("registry lock");
    BUILT_IN.iter().copied().chain(registered.iter().copied()).collect()
}

fn known(classes: impl Fn(&Family) -> Vec<&'static str>) -> String {
    families().iter().flat_map(|f| classes(f)).collect::<Vec<_>>().join(", ")
}

/// The family that loads pipeline class `class`; the error lists the known classes.
pub fn family_of(class: &str) -> Result<&'static Family, ModelError> {
    let refused = families().into_iter().flat_map(|f| f.refused_classes).find(|r| r.0 == class);
    if let Some((_, why)) = refused {
        return Err(ModelError::Input(format!("pipeline class `{class}` is not supported: {why}")));
    }
    families().into_iter().rev().find(|f| f.pipeline_classes.contains(&class)).ok_or_else(|| {
        ModelError::Input(format!(
            "pipeline class `{class}` is not supported; supported: {}",
            known(|f| f.pipeline_classes.to_vec())
        ))
    })
}

/// The family registered under short name `name` (`sd3`); the error lists the names.
pub fn family_named(name: &str) -> Result<&'static Family, ModelError> {
    families().into_iter().rev().find(|f| f.name == name).ok_or_else(|| {
        ModelError::Input(format!("no model family `{name}`; known: {}", known(|f| vec![f.name])))
    })
}

/// Loads the pipeline directory at `path` through the family its `model_index.json` names (with
/// random weights and stand-in text when [`PipelineOptions::random`] says so).
pub fn load_pipeline(
    path: &Path,
    options: &PipelineOptions,
) -> Result<Box<dyn FlowPipeline>, ModelError> {
    let dir = PipelineDir::open(path)?;
    let family = family_of(&dir.index.class_name).map_err(|e| {
        ModelError::Input(format!("{}: {e}", dir.root.join("model_index.json").display()))
    })?;
    let pipe = match options.random {
        None => (family.load)(&dir, options)?,
        Some(random) => {
            let inner = crate::with_random_weights(random.seed, || (family.load)(&dir, options))?;
            Box::new(crate::StandInText { inner, random })
        }
    };
    let (root, class) = (dir.root.display(), &dir.index.class_name);
    let refused = if let Some(g) = options.embedded_guidance.filter(|_| !pipe.embeds_guidance()) {
        format!(
            "embedded guidance {g} (model.guidance / --embedded-guidance) needs a \
             guidance-distilled denoiser such as FLUX.1 [dev]; this {class} has no guidance \
             embedding (classifier-free guidance is rollout.guidance_scale / --guidance)"
        )
    } else if let Some(n) = options.num_frames.filter(|_| !pipe.takes_num_frames()) {
        format!(
            "num_frames {n} (model.num_frames / --num-frames) is for video families such as Wan; \
             this {class} samples pictures"
        )
    } else if let Some(f) = options.frame_rate.filter(|_| !pipe.takes_frame_rate()) {
        format!(
            "frame_rate {f} (model.frame_rate / --frame-rate) is for families with sound such as \
             LTX-2; this {class} does not read it"
        )
    } else if let Some(r) = options.output_resolution.filter(|_| !pipe.takes_output_resolution()) {
        format!(
            "output_resolution {r} (model.output_resolution / --output-resolution) sizes \
             Qwen-Image 2.1's condition pictures; this {class} does not read it"
        )
    } else {
        return Ok(pipe);
    };
    Err(ModelError::Input(format!("{root}: {refused}")))
}

/// Loads a denoiser component directory through the family whose `denoiser_class` its
/// `config.json` names.
pub fn load_denoiser(
    dir: &Path,
    device: Device,
    kind: Kind,
    lora: Option<&LoraConfig>,
) -> Result<Box<dyn TrainableDenoiser>, ModelError> {
    (denoiser_family(dir)?.load_denoiser)(dir, device, kind, lora)
}

/// The family whose `denoiser_class` the component directory's `config.json` names.
pub fn denoiser_family(dir: &Path) -> Result<&'static Family, ModelError> {
    #[derive(serde::Deserialize)]
    struct Class {
        #[serde(rename = "_class_name")]
        class_name: String,
    }
    let path = dir.join("config.json");
    let Class { class_name } = crate::read_config(&path)?;
    families().into_iter().rev().find(|f| f.denoiser_class == class_name).ok_or_else(|| {
        ModelError::Input(format!(
            "{}: denoiser class `{class_name}` is not supported; supported: {}",
            path.display(),
            known(|f| vec![f.denoiser_class])
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_keyed_by_pipeline_class() {
        assert_eq!(family_of("StableDiffusion3Pipeline").unwrap().name, "sd3");
        assert_eq!(family_named("sd3").unwrap().denoiser_class, "SD3Transformer2DModel");
        assert_eq!(family_of("FluxPipeline").unwrap().name, "flux");
        assert_eq!(family_of("WanPipeline").unwrap().name, "wan");
        assert_eq!(family_of("QwenImage21Pipeline").unwrap().name, "qwen_image21");
        // FLUX.2 [dev] is recognised so that its loader can refuse it by name.
        for class in ["Flux2KleinPipeline", "Flux2Pipeline"] {
            assert_eq!(family_of(class).unwrap().name, "flux2");
        }
        let err = family_of("WanImageToVideoPipeline").unwrap_err().to_string();
        assert!(
            err.contains(
                "`WanImageToVideoPipeline` is not supported; supported: StableDiffusion3Pipeline"
            ),
            "{err}"
        );
        for class in ["LTX2Pipeline", "LTX2ImageToVideoPipeline"] {
            assert_eq!(family_of(class).unwrap().name, "ltx2");
        }
        let err = family_of("LTX2LatentUpsamplePipeline").unwrap_err().to_string();
        assert!(err.contains("is not supported: the latent upsampler"), "{err}");
        let err = family_named("hunyuan").unwrap_err().to_string();
        assert!(err.contains("no model family `hunyuan`; known: sd3"), "{err}");
    }
}
