//! The velocity of a tiny transformer on seeded example inputs, and the gradients of `sum(v²)`.

use std::collections::BTreeMap;

use flowtune_models::{ExampleShape, TrainableDenoiser};
use tch::{Kind, Tensor};

/// The velocity and the gradients of `sum(v²)` with respect to every trained weight.
/// (Weights no loss reaches, such as the last block's unused text-stream output, have none.)
pub fn velocity_and_grads(
    model: &dyn TrainableDenoiser,
) -> (Tensor, BTreeMap<String, Option<Tensor>>) {
    tch::manual_seed(3);
    let shape = ExampleShape { batch: 2, frames: 1, height: 4, width: 4, text_len: 5 };
    let inputs = model.example_inputs(shape);
    let params = model.trainable_parameters();
    for p in params.values() {
        let mut g = p.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
    let v = model.velocity(&inputs.latents, &inputs.timestep, &inputs.text).unwrap();
    v.square().sum(Kind::Float).backward();
    let grads = params
        .iter()
        .map(|(n, p)| (n.clone(), Some(p.grad()).filter(Tensor::defined).map(|g| g.copy())))
        .collect();
    (v.detach(), grads)
}
