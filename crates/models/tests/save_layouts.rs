//! Checkpoints in the key layouts other library versions save (`scripts/reference_interop.py`):
//! a `CLIPTextModel` saved by transformers 5 (no `text_model.` prefix) loads, matches transformers
//! and gives exactly the states of the same weights in transformers 4's prefixed layout.

use flowtune_fixtures::{dir, tensors, Checker, MODEL_RTOL};
use flowtune_models::text_encoders::clip::ClipTextModel;
use tch::{Device, Kind, Tensor};

#[test]
fn transformers_5_clip_text_model_loads_as_the_prefixed_layout() {
    let io = tensors("clip_text_v5_io.safetensors");
    let v5 = dir().join("clip_text_v5");
    let stored = Tensor::read_safetensors(v5.join("model.safetensors")).expect("read");
    assert!(stored.iter().all(|(k, _)| !k.starts_with("text_model.")), "the fixture's layout");
    let prefixed = std::env::temp_dir().join(format!("flowtune-clip-v4-{}", std::process::id()));
    std::fs::create_dir_all(&prefixed).unwrap();
    std::fs::copy(v5.join("config.json"), prefixed.join("config.json")).unwrap();
    let renamed: Vec<(String, Tensor)> =
        stored.into_iter().map(|(k, t)| (format!("text_model.{k}"), t)).collect();
    Tensor::write_safetensors(&renamed, prefixed.join("model.safetensors")).unwrap();

    let ids = &io["input.input_ids"];
    let run = |path| {
        let model = ClipTextModel::load(path, Device::Cpu, Kind::Float).expect("load");
        tch::no_grad(|| model.forward(ids)).expect("forward")
    };
    let (ours, v4) = (run(&v5), run(&prefixed));
    std::fs::remove_dir_all(&prefixed).unwrap();
    let mut check = Checker::new("clip_text_v5_io.safetensors");
    check.case();
    for (name, got, prefixed) in [
        ("last_hidden_state", &ours.last_hidden_state, &v4.last_hidden_state),
        ("pooler_output", &ours.pooler_output, &v4.pooler_output),
        ("penultimate_hidden_state", &ours.penultimate_hidden_state, &v4.penultimate_hidden_state),
    ] {
        check.close_within(name, got, &io[&format!("output.{name}")], MODEL_RTOL);
        check.close_within(&format!("{name} (prefixed layout)"), got, prefixed, 0.0);
    }
    check.finish();
}
