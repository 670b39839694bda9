//! DMD2 against `scripts/reference_dmd2.py` (`fixtures/dmd2.*`): the distribution-matching
//! gradient, its normaliser and non-finite count, the surrogate loss and its gradient, the fake
//! score's loss and gradient, the teacher's guidance, the student's grids and the scored noise
//! levels; each against the script's PyTorch writing of the spec and against VeRL-Omni's own
//! functions called on the same tensors (`verl.*`), 1e-5 relative.

use flowtune_fixtures::{json, tensors, Checker};
use flowtune_objectives::losses::{
    dmd_gradient, dmd_loss, fake_score_loss, teacher_guidance, CfgNorm, Dmd2Config,
};
use tch::Tensor;

const RTOL: f64 = 1e-5;

#[test]
fn dmd2_losses_and_gradients_match_the_reference_and_verl_omni() {
    let spec = json("dmd2.json");
    let raw = tensors("dmd2.safetensors");
    assert!(spec["verl"].as_bool().unwrap(), "fixtures/dmd2.* were made with --verl-utils");
    let mut check = Checker::new("dmd2.*");
    let scalar = |v: f64| Tensor::from(v);
    for (i, case) in spec["cases"].as_array().unwrap().iter().enumerate() {
        check.case();
        let fake = &raw[case["fake"].as_str().unwrap()];
        let x = raw["x"].detach().copy().set_requires_grad(true);
        let (g, z, bad) =
            dmd_gradient(fake, &raw["x_real"], &x, case["eps"].as_f64().unwrap()).unwrap();
        assert_eq!(bad, case["nonfinite"].as_i64().unwrap(), "case {i}: non-finite count");
        let out = dmd_loss(&x, &g, &z, bad).unwrap();
        out.loss.backward();
        for source in ["", "verl."] {
            let want_g = &raw[&format!("{source}case{i}.g")];
            check.close_within(&format!("{source}case {i} g"), &g, want_g, RTOL);
            let grad = &raw[&format!("{source}case{i}.grad_x")];
            check.close_within(&format!("{source}case {i} ∂/∂x"), &x.grad(), grad, RTOL);
        }
        check.close_within(&format!("case {i} Z"), &z, &raw[&format!("case{i}.normalizer")], RTOL);
        for key in ["loss", "verl_loss"] {
            let want = scalar(case[key].as_f64().unwrap());
            check.close_within(&format!("case {i} {key}"), &out.loss.detach(), &want, RTOL);
        }
        assert_eq!(out.metrics["dmd/loss"], out.loss.double_value(&[]));
    }
    check.case();
    let velocity = raw["velocity"].detach().copy().set_requires_grad(true);
    let out = fake_score_loss(&velocity, &raw["noise"], &raw["x"]).unwrap();
    out.loss.backward();
    for (source, key) in [("", "loss"), ("verl.", "verl_loss")] {
        let want = scalar(spec["fake"][key].as_f64().unwrap());
        check.close_within(&format!("fake score {key}"), &out.loss.detach(), &want, RTOL);
        let grad = &raw[&format!("{source}fake.grad_velocity")];
        check.close_within(&format!("{source}fake score ∂/∂v"), &velocity.grad(), grad, RTOL);
    }
    for (name, norm) in [("none", CfgNorm::None), ("layer_norm", CfgNorm::LayerNorm)] {
        check.case();
        let got = teacher_guidance(&raw["cond"], &raw["uncond"], 4.0, norm, &[-1]);
        for source in ["", "verl."] {
            let want = &raw[&format!("{source}cfg.{name}")];
            check.close_within(&format!("{source}cfg {name}"), &got, want, RTOL);
        }
    }
    check.finish();
    for grid in spec["student_sigmas"].as_array().unwrap() {
        let config = Dmd2Config {
            student_steps: grid["steps"].as_u64().unwrap() as usize,
            student_shift: grid["shift"].as_f64().unwrap(),
            ..Dmd2Config::default()
        };
        let want: Vec<f32> =
            grid["sigmas"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        assert_eq!(config.student_sigmas(), want, "{grid}");
    }
    let scored = &spec["score_sigmas"];
    let config = Dmd2Config::default();
    for (t, want) in
        scored["t"].as_array().unwrap().iter().zip(scored["sigmas"].as_array().unwrap())
    {
        let u = (t.as_f64().unwrap() + 0.5) / 1000.0;
        assert_eq!(config.score_sigma(u), want.as_f64().unwrap() as f32, "t = {t}");
    }
}
