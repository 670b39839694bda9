//! Gradient (activation) checkpointing changes memory, not numbers: for every family's tiny
//! transformer, the velocity and every trained weight's gradient are the same with the blocks
//! recomputed in backward as without (f32, ≤ 1e-5 relative), under LoRA and full fine-tuning.

use flowtune_fixtures::scratch;
use flowtune_models::wan::{write_tiny_wan, TinyWanSpec, WanTransformer};
use flowtune_models::{
    family_named, load_pipeline, LoraConfig, PipelineOptions, TrainableDenoiser,
};
use tch::{Device, Kind, Tensor};
use velocity_grads::velocity_and_grads;

mod velocity_grads;

fn relative(a: &Tensor, b: &Tensor) -> f64 {
    let scale = a.norm().double_value(&[]).max(1e-12);
    (a - b).norm().double_value(&[]) / scale
}

/// The tiny pipeline of a registered `family`, with `lora`.
fn check(family: &str, lora: Option<LoraConfig>) {
    let dir = scratch(family);
    (family_named(family).unwrap().write_tiny)(&dir, 5).unwrap();
    let options = PipelineOptions { lora: lora.clone(), ..PipelineOptions::new(Device::Cpu) };
    let pipe = load_pipeline(&dir, &options).unwrap();
    check_model(family, pipe.denoiser(), lora.is_some());
}

fn check_model(family: &str, model: &dyn TrainableDenoiser, lora: bool) {
    if lora {
        // B starts at zero, which would leave A without a gradient.
        tch::no_grad(|| {
            for p in model.trainable_parameters().values() {
                p.shallow_clone().copy_(&(p.randn_like() * 0.1));
            }
        });
    }
    let (v, plain) = velocity_and_grads(model);
    model.set_gradient_checkpointing(true);
    let before = flowtune_recompute::recomputed_blocks();
    let (vc, recomputed) = velocity_and_grads(model);
    assert!(flowtune_recompute::recomputed_blocks() > before, "{family}: no block was recomputed");
    model.set_gradient_checkpointing(false);
    assert!(relative(&v, &vc) <= 1e-6, "{family}: velocity {}", relative(&v, &vc));
    // A gradient that cancels to almost nothing is compared against a floor of 1e-3 of the largest
    // one: summed in another order, its few last bits are a large part of it.
    let floor =
        1e-3 * plain.values().flatten().map(|g| g.norm().double_value(&[])).fold(0.0, f64::max);
    let mut worst: f64 = 0.0;
    let mut nonzero = 0;
    for (name, g) in &plain {
        let (Some(g), Some(h)) = (g, &recomputed[name]) else {
            assert!(
                recomputed[name].is_none() && g.is_none(),
                "{family} {name}: a gradient only one way"
            );
            continue;
        };
        let e = (g - h).norm().double_value(&[]) / g.norm().double_value(&[]).max(floor);
        assert!(e <= 1e-5, "{family} {name}: gradient differs by {e:e}");
        worst = worst.max(e);
        nonzero += (g.abs().max().double_value(&[]) > 0.0) as usize;
    }
    assert!(
        nonzero * 2 > plain.len(),
        "{family}: only {nonzero} of {} gradients are nonzero",
        plain.len()
    );
    eprintln!(
        "{family} ({}): {} weights, worst gradient difference {worst:.1e}",
        if lora { "LoRA" } else { "full" },
        plain.len()
    );
}

fn all_linear() -> Option<LoraConfig> {
    Some(LoraConfig { target_modules: vec!["all-linear".into()], ..LoraConfig::default() })
}

#[test]
fn checkpointed_blocks_give_the_same_gradients_in_every_family() {
    for family in ["sd3", "flux", "flux2", "qwen_image", "qwen_image21", "z_image"] {
        check(family, all_linear());
    }
    check("sd3", None);
    // Wan2.2's transformer (per-token timesteps), from its tiny pipeline.
    let dir = scratch("wan");
    write_tiny_wan(&dir, &TinyWanSpec::default()).unwrap();
    let lora = all_linear();
    let wan =
        WanTransformer::load(&dir.join("transformer"), Device::Cpu, Kind::Float, lora.as_ref());
    check_model("wan", &wan.unwrap(), true);
}
