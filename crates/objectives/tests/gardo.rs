//! GARDO against `scripts/reference_gardo.py` (the reference's formulas in numpy and PyTorch,
//! `fixtures/gardo.*`): diversity-shaped advantages, the uncertainty gate with its adaptive share,
//! and the loss with its gradients, each within 1e-5 relative.

use flowtune_fixtures::{json, tensors, Checker};
use flowtune_objectives::gardo::{diversity_advantages, uncertainty, GateController};
use flowtune_objectives::losses::{gardo_loss, GardoBatch};
use flowtune_objectives::LossConfig;
use serde_json::Value;
use tch::Tensor;

const RTOL: f64 = 1e-5;

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

fn vector(values: &[f64]) -> Tensor {
    Tensor::from_slice(values)
}

#[test]
fn advantages_and_gate_match_reference() {
    let spec = json("gardo.json");
    let raw = tensors("gardo.safetensors");
    let mut check = Checker::new("gardo.* (advantages, gate)");
    for (i, case) in spec["advantages"].as_array().unwrap().iter().enumerate() {
        check.case();
        let groups: Vec<u64> =
            case["groups"].as_array().unwrap().iter().map(|g| g.as_u64().unwrap()).collect();
        let features = Vec::<Vec<f32>>::try_from(&raw[&format!("adv{i}.features")]).unwrap();
        let out = diversity_advantages(&floats(&case["rewards"]), &groups, &features).unwrap();
        let want = floats(&case["advantages"]);
        check.close_within(&format!("adv{i}"), &vector(&out.values), &vector(&want), RTOL);
        let (d, want_d) = (vector(&out.distances), vector(&floats(&case["distances"])));
        check.close_within(&format!("adv{i} distances"), &d, &want_d, RTOL);
    }
    let mut controller = GateController::default();
    for (k, step) in spec["gate"].as_array().unwrap().iter().enumerate() {
        check.case();
        let proxies: Vec<Vec<f64>> =
            step["proxies"].as_array().unwrap().iter().map(floats).collect();
        let gate = controller.gate(&uncertainty(&floats(&step["main"]), &proxies));
        check.close_scalar(
            &format!("step {k} kl_perc"),
            controller.share,
            step["kl_perc"].as_f64().unwrap(),
        );
        let want: Vec<bool> =
            step["gate"].as_array().unwrap().iter().map(|g| g.as_bool().unwrap()).collect();
        if gate != want {
            check.fail(format!("step {k}: gate {gate:?}, reference {want:?}"));
        }
    }
    check.finish();
}

#[test]
fn loss_and_gradients_match_reference() {
    let spec = json("gardo.json");
    let raw = tensors("gardo.safetensors");
    let mut check = Checker::new("gardo.* (loss)");
    for (i, case) in spec["losses"].as_array().unwrap().iter().enumerate() {
        check.case();
        let leaf = |name: &str| raw[name].detach().copy().set_requires_grad(true);
        let (log_prob, mean) = (leaf("log_prob"), leaf("prev_sample_mean"));
        let config = LossConfig {
            clip_ratio: case["clip_ratio"].as_f64().unwrap(),
            adv_clip_max: case["adv_clip_max"].as_f64().unwrap(),
            kl_loss_coef: case["kl_loss_coef"].as_f64().unwrap(),
            ..Default::default()
        };
        let out = gardo_loss(
            &GardoBatch {
                log_prob: &log_prob,
                old_log_prob: &raw["old_log_prob"],
                advantages: &raw["advantages"],
                std_dev_t: &raw["std_dev_t"],
                prev_sample_mean: &mean,
                anchor_prev_sample_mean: &raw["anchor_prev_sample_mean"],
                gate: &raw[&format!("loss{i}.gate")],
            },
            &config,
        )
        .unwrap();
        let value = out.loss.double_value(&[]);
        check.close_within(
            &format!("loss{i} value"),
            &Tensor::from(value),
            &Tensor::from(case["value"].as_f64().unwrap()),
            RTOL,
        );
        for name in ["pg_loss", "kl_loss", "pg_clipfrac", "ratio_mean", "ppo_kl"] {
            let got = out.metrics[&format!("actor/{name}")];
            let want = case[name].as_f64().unwrap();
            check.close_within(
                &format!("loss{i} {name}"),
                &Tensor::from(got),
                &Tensor::from(want),
                RTOL,
            );
        }
        out.loss.backward();
        for (name, t) in [("log_prob", &log_prob), ("prev_sample_mean", &mean)] {
            let want = &raw[&format!("loss{i}.grad_{name}")];
            check.close_within(&format!("loss{i} ∂/∂{name}"), &t.grad(), want, RTOL);
        }
    }
    check.finish();
}
