//! DGPO against `scripts/reference_dgpo.py` (the reference's loss written one group at a time,
//! `fixtures/dgpo.*`): value, metrics and the gradient of the trained velocity, 1e-6 relative, at
//! four settings (clip off and on, with and without the reference MSE, a saturated group weight)
//! and on groups of unequal size with one of equal rewards (A = 0 rows, which the reference's
//! `clip_frac` counts when their ratio fell; group weights averaged over rows).

use flowtune_fixtures::{json, tensors, Checker};
use flowtune_objectives::losses::{dgpo_loss, DgpoBatch, DgpoSettings};
use tch::Tensor;

const RTOL: f64 = 1e-6;

#[test]
fn dgpo_loss_and_gradient_match_reference() {
    let spec = json("dgpo.json");
    let raw = tensors("dgpo.safetensors");
    let mut check = Checker::new("dgpo.*");
    for (i, case) in spec["cases"].as_array().unwrap().iter().enumerate() {
        check.case();
        let f = |k: &str| case[k].as_f64().unwrap();
        let input = |k: &str| &raw[&format!("{}{k}", case["inputs"].as_str().unwrap())];
        let pred = input("policy_pred").detach().copy().set_requires_grad(true);
        let out = dgpo_loss(
            &DgpoBatch {
                x0: input("x0"),
                noise: input("noise"),
                advantages: input("advantages"),
                groups: input("groups"),
                policy_pred: &pred,
                old_pred: input("old_pred"),
                ref_pred: input("ref_pred"),
            },
            DgpoSettings {
                beta: f("beta"),
                clip_range: f("clip_range"),
                ref_kl_coef: f("ref_kl_coef"),
                adv_clip_max: f("adv_clip_max"),
            },
        )
        .unwrap();
        let scalar = |v: f64| Tensor::from(v);
        check.close_within(
            &format!("case {i} value"),
            &scalar(out.loss.double_value(&[])),
            &scalar(f("value")),
            RTOL,
        );
        for name in [
            "policy_loss",
            "kl_loss",
            "dsm_loss",
            "clip_frac",
            "group_weight_mean",
            "group_weight_dev",
        ] {
            let got = out.metrics[&format!("actor/{name}")];
            check.close_within(&format!("case {i} {name}"), &scalar(got), &scalar(f(name)), RTOL);
        }
        out.loss.backward();
        let want = &raw[&format!("case{i}.grad_policy_pred")];
        check.close_within(&format!("case {i} ∂/∂policy_pred"), &pred.grad(), want, RTOL);
    }
    check.finish();
}
