//! SD3 / SD3.5 transformer parity with diffusers over every `sd3_transformer` fixture of
//! `manifest.json`: outputs with and without LoRA, and every LoRA gradient.

use flowtune_fixtures::{dir, models_of_kind, tensors, Checker, MODEL_RTOL};
use flowtune_models::lora::LoraConfig;
use flowtune_models::sd3::Sd3Transformer;
use flowtune_models::TrainableDenoiser;
use tch::{Device, Kind};

/// The transformer on a fixture's `input.*` tensors.
fn forward(m: &Sd3Transformer, io: &std::collections::HashMap<String, tch::Tensor>) -> tch::Tensor {
    let input = |k: &str| &io[&format!("input.{k}")];
    m.forward(
        input("hidden_states"),
        input("encoder_hidden_states"),
        input("pooled_projections"),
        input("timestep"),
    )
    .expect("forward")
}

#[test]
fn sd3_transformers_match_diffusers() {
    let mut check = Checker::new("manifest.json sd3_transformer");
    for entry in models_of_kind("sd3_transformer") {
        check.case();
        let name = entry["name"].as_str().expect("name");
        let model_dir = dir().join(entry["model"].as_str().expect("model"));
        let io = tensors(&format!("{name}_io.safetensors"));
        let l = &entry["lora"];
        let lora = LoraConfig {
            rank: l["r"].as_i64().expect("r"),
            alpha: l["alpha"].as_f64().expect("alpha"),
            target_modules: l["targets"]
                .as_array()
                .expect("targets")
                .iter()
                .map(|t| t.as_str().unwrap().to_string())
                .collect(),
            ..Default::default()
        };
        let mut model =
            Sd3Transformer::load(&model_dir, Device::Cpu, Kind::Float, Some(&lora)).expect("load");
        model.load_lora(&dir().join(format!("{name}_lora.safetensors"))).expect("load lora");
        let run = |m: &Sd3Transformer| forward(m, &io);
        model.set_adapters_enabled(false);
        let plain = tch::no_grad(|| run(&model));
        check.close_within(
            &format!("{name} output.sample"),
            &plain,
            &io["output.sample"],
            MODEL_RTOL,
        );
        model.set_adapters_enabled(true);
        let out = run(&model);
        check.close_within(
            &format!("{name} output.sample_with_lora"),
            &out,
            &io["output.sample_with_lora"],
            MODEL_RTOL,
        );
        (out * &io["loss_weight"]).mean(Kind::Float).backward();
        let store = &model.adapters().expect("adapters").store;
        let vars = store.variables();
        let mut grads = 0;
        for (key, want) in io.iter().filter(|(k, _)| k.starts_with("grad.transformer.")) {
            let var_name = &key["grad.transformer.".len()..];
            match vars.get(var_name) {
                Some(v) => check.close_within(key, &v.grad(), want, MODEL_RTOL),
                None => check.fail(format!("{name}: no adapter variable {var_name}")),
            }
            grads += 1;
        }
        if model.store().variables().values().any(|v| v.requires_grad() || v.grad().defined()) {
            check.fail(format!("{name}: base weights must not train"));
        }
        if grads != vars.len() || entry["lora_params"].as_u64() != Some(grads as u64) {
            check.fail(format!(
                "{name}: {grads} reference gradients, {} adapter tensors",
                vars.len()
            ));
        }
    }
    check.finish();
}

#[test]
fn lora_files_round_trip_with_their_config() {
    let model_dir = dir().join("sd3_tiny");
    let io = tensors("sd3_tiny_io.safetensors");
    let lora = LoraConfig { rank: 4, alpha: 8.0, ..Default::default() };
    let mut model =
        Sd3Transformer::load(&model_dir, Device::Cpu, Kind::Float, Some(&lora)).expect("load");
    // Fresh adapters (B = 0) leave the model unchanged.
    let fresh = tch::no_grad(|| forward(&model, &io));
    model.set_adapters_enabled(false);
    assert!(
        fresh.equal(&tch::no_grad(|| forward(&model, &io))),
        "fresh adapters change the output"
    );
    model.set_adapters_enabled(true);
    model.load_lora(&dir().join("sd3_tiny_lora.safetensors")).expect("fixture lora");
    let scratch = flowtune_fixtures::scratch("lora");
    let path = scratch.join("adapter.safetensors");
    model.save_lora(&path).expect("save");
    let read = flowtune_models::lora::read_config(&path, "transformer").expect("read config");
    assert_eq!((read.rank, read.alpha, &read.target_modules), (4, 8.0, &lora.target_modules));
    let mut again =
        Sd3Transformer::load(&model_dir, Device::Cpu, Kind::Float, Some(&read)).expect("load");
    again.load_lora(&path).expect("load saved lora");
    let run = |m: &Sd3Transformer| tch::no_grad(|| forward(m, &io));
    let (a, b) = (run(&model), run(&again));
    assert!(a.equal(&b), "a saved and reloaded LoRA gives the same output");
    let rel = (&a - &io["output.sample_with_lora"]).norm().double_value(&[])
        / io["output.sample_with_lora"].norm().double_value(&[]);
    assert!(rel < MODEL_RTOL, "{rel}");

    // Merged into the base weights, the adapters' effect stays and they switch off.
    again.merge_lora().expect("merge");
    let merged = run(&again);
    let rel = (&merged - &a).norm().double_value(&[]) / a.norm().double_value(&[]);
    assert!(rel < 1e-5, "merged output differs by {rel}");
    assert!(!again.adapters().unwrap().switch.enabled());
}
