//! Random LTX-2 transformers in the diffusers layout, for `make-tiny` and tests.

use std::path::Path;

use flowtune_sampling::SampleRng;
use tch::{Device, Kind};

use super::config::Ltx2TransformerConfig;
use super::model::Ltx2Transformer;
use crate::sd3::tiny::{randomize, write_model};
use crate::sd3::WeightInit;
use crate::ModelError;

/// Writes a transformer of `config` with weights drawn by `init` from `rng`, in `kind`, as a
/// diffusers `transformer/` folder `dir` (config.json + safetensors) that diffusers loads.
pub fn write_random_transformer(
    dir: &Path,
    config: &Ltx2TransformerConfig,
    rng: &mut SampleRng,
    init: WeightInit,
    kind: Kind,
) -> Result<(), ModelError> {
    let model = Ltx2Transformer::new(config, Device::Cpu, kind, None)?;
    randomize(&model.weights.base, rng, init)?;
    write_model(dir, &model.weights.base, config)
}
