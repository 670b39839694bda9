//! Layers on one input run as one GEMM ([`flowtune_models::nn::project`]): for every family's
//! tiny transformer with LoRA, the velocity and the adapters' gradients are those of the layers
//! run apart (f32, within 1e-6 of the largest value; gradients 1e-5), fused GEMMs ran, and the adapters keep
//! their names.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use flowtune_fixtures::scratch;
use flowtune_models::nn::fused_gemms;
use flowtune_models::shard::{Alone, ShardMode};
use flowtune_models::{
    family_named, load_pipeline, ExampleShape, LoraConfig, PipelineOptions, TrainableDenoiser,
};
use tch::{Device, Tensor};

mod velocity_grads;

/// The velocity and the gradients of `sum(v²)` for every adapter weight that has one.
fn velocity_and_grads(model: &dyn TrainableDenoiser) -> (Tensor, BTreeMap<String, Tensor>) {
    let (v, grads) = velocity_grads::velocity_and_grads(model);
    (v, grads.into_iter().filter_map(|(n, g)| Some((n, g?))).collect())
}

/// The largest elementwise difference, over the largest value of `reference`.
fn largest_difference(reference: &Tensor, other: &Tensor) -> f64 {
    let largest = |t: &Tensor| t.abs().max().double_value(&[]);
    largest(&(reference - other)) / largest(reference).max(1e-30)
}

/// The tests draw their inputs from libtorch's one global generator: one at a time.
static SEEDED: Mutex<()> = Mutex::new(());

fn check(family: &str, targets: &[&str]) {
    let _seeded = SEEDED.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch(family);
    (family_named(family).unwrap().write_tiny)(&dir, 5).unwrap();
    let lora = LoraConfig {
        target_modules: targets.iter().map(|t| t.to_string()).collect(),
        ..LoraConfig::default()
    };
    let options = PipelineOptions { lora: Some(lora), ..PipelineOptions::new(Device::Cpu) };
    let pipe = load_pipeline(&dir, &options).unwrap();
    let model = pipe.denoiser();
    // B starts at zero, which would leave A without a gradient.
    tch::no_grad(|| {
        for p in model.trainable_parameters().values() {
            p.shallow_clone().copy_(&(p.randn_like() * 0.1));
        }
    });
    let before = fused_gemms();
    let (v, grads) = velocity_and_grads(model);
    assert!(fused_gemms() > before, "{family}: no fused GEMM ran");
    model.set_fused_projections(false);
    let before = fused_gemms();
    let (apart, apart_grads) = velocity_and_grads(model);
    assert_eq!(fused_gemms(), before, "{family}: fused while switched off");
    model.set_fused_projections(true);
    let error = largest_difference(&apart, &v);
    assert!(error <= 1e-6, "{family}: velocity {error:e} of the largest value");
    assert_eq!(grads.keys().collect::<Vec<_>>(), apart_grads.keys().collect::<Vec<_>>());
    assert!(!grads.is_empty(), "{family}: no adapter gradient");
    // Gradients sum over more terms in another order: 1e-5 (as gradient checkpointing's test).
    for (name, g) in &apart_grads {
        let error = largest_difference(g, &grads[name]);
        assert!(error <= 1e-5, "{family}: {name} gradient {error:e} of its largest value");
    }
}

/// Every family, with its default LoRA targets.
#[test]
fn fused_projections_equal_the_layers_apart() {
    for family in ["sd3", "flux", "flux2", "qwen_image", "qwen_image21", "z_image", "wan"] {
        let targets = family_named(family).unwrap().lora_targets;
        check(family, targets);
    }
}

/// Adapters on some of the fused layers only.
#[test]
fn fused_projections_with_some_layers_adapted() {
    check("sd3", &["to_k", "add_v_proj"]);
}

/// Sharded frozen blocks are gathered with the fused layers' weights still together: the fused
/// GEMMs run and give the velocity of the unsharded model.
#[test]
fn sharded_blocks_keep_their_projections_fused() {
    let _seeded = SEEDED.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("fused-sharded");
    (family_named("flux").unwrap().write_tiny)(&dir, 5).unwrap();
    let lora = LoraConfig { target_modules: vec!["to_k".into()], ..LoraConfig::default() };
    let options = PipelineOptions { lora: Some(lora), ..PipelineOptions::new(Device::Cpu) };
    let pipe = load_pipeline(&dir, &options).unwrap();
    let model = pipe.denoiser();
    let velocity = || {
        tch::manual_seed(3);
        let shape = ExampleShape { batch: 2, frames: 1, height: 4, width: 4, text_len: 5 };
        let inputs = model.example_inputs(shape);
        tch::no_grad(|| model.velocity(&inputs.latents, &inputs.timestep, &inputs.text)).unwrap()
    };
    let whole = velocity();
    model.shard_blocks(Arc::new(Alone), ShardMode::Frozen, false).unwrap();
    let before = fused_gemms();
    let sharded = velocity();
    assert!(fused_gemms() > before, "no fused GEMM ran in sharded blocks");
    // The gathered weights lie elsewhere in memory: the GEMM may round otherwise (release builds).
    let error = largest_difference(&whole, &sharded);
    assert!(error <= 1e-6, "sharded blocks: velocity {error:e} of the largest value");
}
