//! The LoRA parity check shared by the transformer parity tests.

use std::collections::HashMap;
use std::path::Path;

use flowtune_fixtures::{dir, models_of_kind, tensors, Checker, MODEL_RTOL};
use flowtune_models::lora::LoraConfig;
use flowtune_models::TrainableDenoiser;
use tch::{Kind, Tensor};

/// The LoRA config of a fixture entry.
fn lora_of(entry: &serde_json::Value) -> LoraConfig {
    let l = &entry["lora"];
    LoraConfig {
        rank: l["r"].as_i64().expect("r"),
        alpha: l["alpha"].as_f64().expect("alpha"),
        target_modules: l["targets"]
            .as_array()
            .expect("targets")
            .iter()
            .map(|t| t.as_str().unwrap().to_string())
            .collect(),
        ..Default::default()
    }
}

/// Every `kind` fixture of `manifest.json` against its model, loaded by `load` from its folder
/// with its LoRA: `output.sample` with the adapters off, `output.sample_with_lora` with them on,
/// and every adapter gradient of mean(sample_with_lora · loss_weight); base weights stay frozen.
/// An adapter without a reference gradient fails unless `unreached` (then it must have none).
pub fn check_lora_fixtures<M: TrainableDenoiser>(
    kind: &str,
    load: impl Fn(&Path, &LoraConfig) -> M,
    forward: impl Fn(&M, &HashMap<String, Tensor>) -> Tensor,
    unreached: bool,
) {
    let mut check = Checker::new(&format!("manifest.json {kind}"));
    for entry in models_of_kind(kind) {
        check.case();
        let name = entry["name"].as_str().expect("name");
        let io = tensors(&format!("{name}_io.safetensors"));
        let mut model =
            load(&dir().join(entry["model"].as_str().expect("model")), &lora_of(&entry));
        model.load_lora(&dir().join(format!("{name}_lora.safetensors"))).expect("load lora");
        model.set_adapters_enabled(false);
        let plain = tch::no_grad(|| forward(&model, &io));
        check.close_within(
            &format!("{name} output.sample"),
            &plain,
            &io["output.sample"],
            MODEL_RTOL,
        );
        model.set_adapters_enabled(true);
        let out = forward(&model, &io);
        check.close_within(
            &format!("{name} output.sample_with_lora"),
            &out,
            &io["output.sample_with_lora"],
            MODEL_RTOL,
        );
        (out * &io["loss_weight"]).mean(Kind::Float).backward();
        let vars = model.adapters().expect("adapters").store.variables();
        let adapted = entry["adapted_modules"].as_array().expect("adapted_modules").len();
        if vars.len() != 2 * adapted {
            check.fail(format!(
                "{name}: {} adapter tensors, PEFT adapts {adapted} modules",
                vars.len()
            ));
        }
        for (var_name, var) in &vars {
            match io.get(&format!("grad.transformer.{var_name}")) {
                Some(want) => check.close_within(var_name, &var.grad(), want, MODEL_RTOL),
                None if unreached
                    && (!var.grad().defined()
                        || var.grad().abs().max().double_value(&[]) == 0.0) => {}
                None if unreached => {
                    check.fail(format!("{name}: {var_name} has a gradient, diffusers' has none"))
                }
                None => check.fail(format!("{name}: no reference gradient for {var_name}")),
            }
        }
        if model.store().variables().values().any(|v| v.requires_grad() || v.grad().defined()) {
            check.fail(format!("{name}: base weights must not train"));
        }
    }
    check.finish();
}
