//! Checkpoint loading: sharded files with an index, dtype on load, and clear errors for missing,
//! unexpected and misshaped tensors.

use std::path::Path;

use flowtune_fixtures::{dir, tensors, Scratch};
use flowtune_models::sd3::Sd3Transformer;
use tch::{Device, Kind, Tensor};

fn scratch(name: &str) -> Scratch {
    let d = flowtune_fixtures::scratch(&format!("loading-{name}"));
    std::fs::copy(dir().join("sd3_tiny/config.json"), d.join("config.json")).unwrap();
    d
}

fn reference_weights() -> Vec<(String, Tensor)> {
    let mut w: Vec<(String, Tensor)> =
        tensors("sd3_tiny/diffusion_pytorch_model.safetensors").into_iter().collect();
    w.sort_by(|a, b| a.0.cmp(&b.0));
    w
}

/// Writes `weights` as `shards` files plus a diffusers index.
fn write_sharded(d: &Path, weights: &[(String, Tensor)], shards: usize, kind: Kind) {
    let per = weights.len().div_ceil(shards);
    let mut map = serde_json::Map::new();
    for (i, chunk) in weights.chunks(per).enumerate() {
        let file = format!("diffusion_pytorch_model-{:05}-of-{:05}.safetensors", i + 1, shards);
        let converted: Vec<(String, Tensor)> =
            chunk.iter().map(|(n, t)| (n.clone(), t.to_kind(kind))).collect();
        Tensor::write_safetensors(&converted, d.join(&file)).unwrap();
        for (n, _) in chunk {
            map.insert(n.clone(), serde_json::Value::String(file.clone()));
        }
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": map });
    std::fs::write(d.join("diffusion_pytorch_model.safetensors.index.json"), index.to_string())
        .unwrap();
}

fn output(model: &Sd3Transformer) -> Tensor {
    let io = tensors("sd3_tiny_io.safetensors");
    let kind = model.time_text_embed.timestep_embedder.linear_1.weight.kind();
    tch::no_grad(|| {
        model
            .forward(
                &io["input.hidden_states"].to_kind(kind),
                &io["input.encoder_hidden_states"].to_kind(kind),
                &io["input.pooled_projections"].to_kind(kind),
                &io["input.timestep"],
            )
            .unwrap()
            .to_kind(Kind::Float)
    })
}

fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).norm().double_value(&[]) / b.norm().double_value(&[])
}

#[test]
fn sharded_checkpoints_load_in_f32_and_bf16() {
    let want = tensors("sd3_tiny_io.safetensors")["output.sample"].shallow_clone();
    for (kind, stored, tol) in [
        (Kind::Float, Kind::Float, 1e-5),
        (Kind::BFloat16, Kind::BFloat16, 5e-2),
        (Kind::Float, Kind::BFloat16, 5e-2),
    ] {
        let d = scratch(&format!("{kind:?}-{stored:?}"));
        write_sharded(&d, &reference_weights(), 3, stored);
        let model = Sd3Transformer::load(&d, Device::Cpu, kind, None).expect("sharded load");
        assert_eq!(model.time_text_embed.timestep_embedder.linear_1.weight.kind(), kind);
        let err = rel_err(&output(&model), &want);
        assert!(err < tol, "{kind:?} from {stored:?} shards: relative error {err}");
    }
}

fn load_error(weights: Vec<(String, Tensor)>, name: &str) -> String {
    let d = scratch(name);
    Tensor::write_safetensors(&weights, d.join("diffusion_pytorch_model.safetensors")).unwrap();
    match Sd3Transformer::load(&d, Device::Cpu, Kind::Float, None) {
        Ok(_) => panic!("{name}: loading should fail"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_checkpoints_name_file_and_tensor() {
    let mut w = reference_weights();
    w.retain(|(n, _)| n != "proj_out.weight");
    let err = load_error(w, "missing");
    assert!(
        err.contains("diffusion_pytorch_model.safetensors: missing tensor(s) proj_out.weight"),
        "{err}"
    );

    let mut w = reference_weights();
    w.push((
        "transformer_blocks.9.attn.to_q.weight".into(),
        Tensor::zeros([2], (Kind::Float, Device::Cpu)),
    ));
    let err = load_error(w, "unexpected");
    assert!(err.contains("unexpected tensor(s) transformer_blocks.9.attn.to_q.weight"), "{err}");

    let mut w = reference_weights();
    for (n, t) in w.iter_mut() {
        if n == "context_embedder.weight" {
            *t = Tensor::zeros([32, 16], (Kind::Float, Device::Cpu));
        }
    }
    let err = load_error(w, "shape");
    assert!(
        err.contains(
            "tensor context_embedder.weight has shape [32, 16], the config expects [32, 32]"
        ),
        "{err}"
    );
}
