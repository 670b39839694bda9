//! Parity with the reference framework over `advantages.json` and `losses.*`: values, metrics and
//! gradients of every case.

use std::collections::HashMap;

use flowtune_fixtures::{json, tensors, Checker};
use flowtune_objectives::losses::{
    dpo_loss, kl_to_reference, nft_loss, DpoBatch, NftBatch, PolicyBatch, PolicyLoss,
};
use flowtune_objectives::{group_advantages, AdvantageConfig, LossConfig, LossOutput};
use serde_json::Value;
use tch::Tensor;

#[test]
fn advantages_match_reference() {
    let cases = json("advantages.json");
    let mut check = Checker::new("advantages.json");
    for (i, case) in cases.as_array().expect("list of cases").iter().enumerate() {
        check.case();
        let rewards: Vec<f32> = case["rewards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_f64().unwrap() as f32)
            .collect();
        let groups: Vec<u64> =
            case["index"].as_array().unwrap().iter().map(|g| g.as_u64().unwrap()).collect();
        let config = AdvantageConfig {
            global_std: case["global_std"].as_bool().unwrap(),
            norm_adv_by_std: case["norm_adv_by_std"].as_bool().unwrap(),
        };
        let steps = case["steps"].as_u64().unwrap() as usize;
        let out = group_advantages(&rewards, &groups, steps, &config).expect("advantages");
        let want: Vec<f32> = case["advantages"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|row| row.as_array().unwrap().iter().map(|a| a.as_f64().unwrap() as f32))
            .collect();
        let label =
            format!("case {i} (global_std {}, norm {})", config.global_std, config.norm_adv_by_std);
        check.close(&label, &out.values, &Tensor::from_slice(&want));
    }
    check.finish();
}

/// Case fields that are neither loss settings nor bookkeeping are metrics to compare.
const BOOKKEEPING: [&str; 3] = ["loss", "key", "value"];

/// The fixtures' flat names of settings that live in an algorithm's section of `actor` now.
const IN_SECTIONS: [(&str, [&str; 2]); 2] =
    [("dpo_beta", ["dpo", "beta"]), ("mix_beta", ["nft", "beta"])];

fn loss_config(case: &Value) -> (LossConfig, Vec<(String, f64)>) {
    let mut config = serde_json::to_value(LossConfig::default()).expect("serialise");
    let mut metrics = vec![];
    for (field, value) in case.as_object().expect("case object") {
        if BOOKKEEPING.contains(&field.as_str()) {
            continue;
        }
        if let Some((_, [section, key])) = IN_SECTIONS.iter().find(|(flat, _)| flat == field) {
            config[section][key] = value.clone();
        } else if config.get(field).is_some() {
            config[field] = value.clone();
        } else {
            metrics.push((field.clone(), value.as_f64().expect("numeric metric")));
        }
    }
    (serde_json::from_value(config).expect("loss settings"), metrics)
}

fn evaluate(kind: &str, config: &LossConfig, t: &HashMap<String, Tensor>) -> LossOutput {
    let policy = |loss: PolicyLoss| {
        let batch = PolicyBatch {
            log_prob: &t["log_prob"],
            old_log_prob: &t["old_log_prob"],
            advantages: &t["advantages"],
            prev_sample_mean: Some(&t["prev_sample_mean"]),
            old_prev_sample_mean: Some(&t["old_prev_sample_mean"]),
            std_dev_t: Some(&t["std_dev_t"]),
            sqrt_dt: Some(&t["sqrt_dt"]),
            weights: None,
            keep: None,
        };
        loss.compute(&batch, config).expect("policy loss")
    };
    match kind {
        "flow_grpo" => policy(PolicyLoss::Clipped),
        "grpo_guard" => policy(PolicyLoss::Guard),
        "flow_dppo" => policy(PolicyLoss::Dppo),
        "kl" => {
            kl_to_reference(&t["prev_sample_mean"], &t["ref_prev_sample_mean"], &t["std_dev_t"])
                .expect("kl")
        }
        "dpo" => {
            let batch = DpoBatch {
                latents: &t["dpo.latent"],
                noise: &t["dpo.noise"],
                model_pred: &t["dpo.noise_pred"],
                ref_pred: &t["dpo.ref_noise_pred"],
            };
            dpo_loss(&batch, config.dpo.beta).expect("dpo")
        }
        "diffusion_nft" => {
            let batch = NftBatch {
                x0: &t["nft.x0"],
                xt: &t["nft.xt"],
                t: &t["nft.t"],
                reward_prob: &t["nft.reward_prob"],
                policy_pred: &t["nft.forward_prediction"],
                old_pred: &t["nft.old_prediction"],
                ref_pred: &t["nft.ref_forward_prediction"],
            };
            nft_loss(&batch, config.nft.beta, config.ref_kl_coef, config.adv_clip_max).expect("nft")
        }
        other => panic!("losses.json: unknown loss kind `{other}`"),
    }
}

#[test]
fn losses_match_reference() {
    let spec = json("losses.json");
    let raw = tensors("losses.safetensors");
    let mut check = Checker::new("losses.*");
    for case in spec["cases"].as_array().expect("cases") {
        check.case();
        let key = case["key"].as_str().expect("key");
        let kind = case["loss"].as_str().expect("loss");
        let (config, metrics) = loss_config(case);
        // Fresh leaves per case so gradients do not accumulate across cases.
        let inputs: HashMap<String, Tensor> = raw
            .iter()
            .filter(|(name, _)| !name.contains(".grad_"))
            .map(|(name, t)| (name.clone(), t.detach().copy().set_requires_grad(true)))
            .collect();
        let out = evaluate(kind, &config, &inputs);
        check.close_scalar(
            &format!("{key} value"),
            out.loss.double_value(&[]),
            case["value"].as_f64().unwrap(),
        );
        for (name, want) in metrics {
            match out.metrics.get(&format!("actor/{name}")) {
                Some(&got) => check.close_scalar(&format!("{key} actor/{name}"), got, want),
                None => check.fail(format!("{key}: no metric actor/{name}")),
            }
        }
        out.loss.backward();
        let prefix = format!("{key}.grad_");
        let mut grads = 0;
        for (name, want) in raw.iter().filter(|(n, _)| n.starts_with(&prefix)) {
            let input = &name[prefix.len()..];
            let leaf = inputs
                .iter()
                .find(|(n, _)| n.as_str() == input || n.ends_with(&format!(".{input}")));
            match leaf {
                Some((_, leaf)) if leaf.grad().defined() => check.close(name, &leaf.grad(), want),
                _ => check.fail(format!("{name}: the loss has no gradient for `{input}`")),
            }
            grads += 1;
        }
        if grads == 0 {
            check.fail(format!("{key}: no reference gradients in losses.safetensors"));
        }
    }
    check.finish();
}
