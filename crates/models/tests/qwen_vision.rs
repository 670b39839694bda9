//! Qwen2.5-VL's vision tower and the Qwen2-VL image processor against transformers
//! (`scripts/reference_qwen_vision.py`).

use flowtune_fixtures::{dir, tensors, Checker};
use flowtune_models::text_encoders::qwen2_5_vl_vision::{Qwen25VlVision, Qwen25VlVisionConfig};
use flowtune_models::text_encoders::qwen2_vl_processor::Qwen2VlImageProcessor;
use flowtune_models::text_encoders::qwen_tiny::{write_tiny_qwen_text_encoder, TinyQwenTextSpec};
use flowtune_models::ModelError;
use tch::{Device, Kind, Tensor};

const IO: &str = "qwen_vision_io.safetensors";
/// (case, uses `qwen_vision_processor/preprocessor_config.json` rather than the defaults)
const PICTURES: &[(&str, bool)] = &[("up", false), ("tie", false), ("wide", false), ("down", true)];

fn grids(t: &Tensor) -> Vec<(i64, i64, i64)> {
    let v = Vec::<i64>::try_from(t.reshape([-1])).expect("grid_thw i64");
    v.chunks(3).map(|g| (g[0], g[1], g[2])).collect()
}

#[test]
fn vision_tower_matches_transformers() {
    let io = tensors(IO);
    let mut check = Checker::new("qwen_vision_io.safetensors <model>.output");
    let nested_pixels =
        Tensor::cat(&[&io["processor.wide.pixel_values"], &io["processor.down.pixel_values"]], 0);
    for (name, pixels) in
        [("window", io["window.pixel_values"].shallow_clone()), ("nested", nested_pixels)]
    {
        check.case();
        let model = Qwen25VlVision::load(
            &dir().join(format!("qwen_vision_{name}")),
            Device::Cpu,
            Kind::Float,
        )
        .expect("load");
        let grid = grids(&io[&format!("{name}.grid_thw")]);
        let out = tch::no_grad(|| model.forward(&pixels, &grid)).expect("forward");
        check.close(&format!("{name}.output"), &out, &io[&format!("{name}.output")]);
    }
    check.finish();
}

#[test]
fn processor_matches_transformers() {
    let io = tensors(IO);
    let custom = Qwen2VlImageProcessor::load(&dir().join("qwen_vision_processor")).expect("load");
    assert_eq!((custom.min_pixels, custom.max_pixels), (28 * 28 * 2, 28 * 28 * 6));
    let default = Qwen2VlImageProcessor::load(&dir().join("qwen_vision_window")).expect("defaults");
    assert_eq!(default, Qwen2VlImageProcessor::default());
    for (case, use_custom) in PICTURES {
        let image = &io[&format!("processor.{case}.image")];
        let (h, w) = (image.size()[0] as usize, image.size()[1] as usize);
        let bytes = Vec::<u8>::try_from(image.reshape([-1])).expect("u8 picture");
        let processor = if *use_custom { &custom } else { &default };
        let (pixels, grid) = processor.preprocess(h, w, &bytes, Device::Cpu).expect("preprocess");
        assert_eq!(vec![grid], grids(&io[&format!("processor.{case}.grid_thw")]), "{case} grid");
        let reference = &io[&format!("processor.{case}.pixel_values")];
        assert_eq!(pixels.size(), reference.size(), "{case} pixel_values shape");
        let diff = (&pixels - reference).abs();
        let max = diff.max().double_value(&[]);
        let off = diff.gt(1e-5).sum(Kind::Int64).int64_value(&[]);
        println!(
            "{case}: {h}×{w} → {grid:?}, max |Δ| {max:.2e}, {off}/{} values off",
            diff.numel()
        );
        // The resize is Pillow's, bit for bit: only float rounding of the normalisation remains.
        assert_eq!(off, 0, "{case}: {off} values differ (max |Δ| {max})");
    }
}

#[test]
fn loads_the_tiny_writers_tower_and_names_bad_configs() {
    let scratch = flowtune_fixtures::scratch("qwen-vis");
    let (te, tok) = (scratch.join("text_encoder"), scratch.join("tokenizer"));
    let spec = TinyQwenTextSpec::default();
    write_tiny_qwen_text_encoder(&te, &tok, 3, &spec).expect("write tiny");
    let model = Qwen25VlVision::load(&te, Device::Cpu, Kind::Float).expect("load tiny tower");
    assert_eq!(model.config.depth, 1);
    let pixels = Tensor::zeros([16, model.config.patch_dim()], (Kind::Float, Device::Cpu));
    let out = model.forward(&pixels, &[(1, 4, 4)]).expect("forward");
    assert_eq!(out.size(), [4, spec.hidden_size]);
    let err = model.forward(&pixels, &[(1, 4, 6)]).expect_err("token count mismatch");
    assert!(matches!(err, ModelError::Input(_)), "{err}");

    let config = scratch.join("bad.json");
    std::fs::write(&config, r#"{"vision_config": {"hidden_act": "gelu"}}"#).expect("write");
    let err = Qwen25VlVisionConfig::from_file(&config).expect_err("gelu is not supported");
    assert!(err.to_string().contains("hidden_act"), "{err}");
}
