//! DiffusionOPD's `distill_kl` against `scripts/reference_diffusion_opd.py` (`fixtures/diffusion_opd.*`):
//! the value and the gradient of the student's transition mean, with and without per-row teacher
//! weights, within 1e-5 relative.

use flowtune_fixtures::{json, tensors, Checker};
use flowtune_objectives::losses::distill_kl;
use tch::Tensor;

#[test]
fn distill_kl_and_gradient_match_reference() {
    let spec = json("diffusion_opd.json");
    let raw = tensors("diffusion_opd.safetensors");
    let mut check = Checker::new("diffusion_opd.*");
    for (i, case) in spec["cases"].as_array().unwrap().iter().enumerate() {
        check.case();
        let mean = raw["prev_sample_mean"].detach().copy().set_requires_grad(true);
        let weights = case["weighted"].as_bool().unwrap().then(|| &raw["weights"]);
        let out = distill_kl(&mean, &raw["teacher_prev_sample_mean"], &raw["std_dev_t"], weights)
            .unwrap();
        let value = out.loss.double_value(&[]);
        let want = case["value"].as_f64().unwrap();
        check.close_within(
            &format!("case {i} value"),
            &Tensor::from(value),
            &Tensor::from(want),
            1e-5,
        );
        let metric = out.metrics["actor/distill_kl_loss"];
        check.close_within(
            &format!("case {i} metric"),
            &Tensor::from(metric),
            &Tensor::from(want),
            1e-5,
        );
        out.loss.backward();
        let grad = &raw[&format!("case{i}.grad_prev_sample_mean")];
        check.close_within(&format!("case {i} ∂/∂μ"), &mean.grad(), grad, 1e-5);
    }
    check.finish();
}
