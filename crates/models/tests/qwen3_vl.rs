//! Qwen3-VL's vision tower (merged embeddings and deepstack features) and its language model with
//! pictures (interleaved 3-D rotary positions, deepstack), and Qwen-Image 2.1's prompt encoding
//! with condition images, against transformers and diffusers
//! (`scripts/reference_qwen_image21_images.py`).

use flowtune_fixtures::{dir, tensors, Checker, MATH_RTOL};
use flowtune_models::qwen_image::calculate_dimensions;
use flowtune_models::qwen_image21::QwenImage21Pipeline;
use flowtune_models::resize::{resize, Filter};
use flowtune_models::text_encoders::qwen3_vl::Qwen3VlEncoder;
use flowtune_models::PipelineOptions;
use image::RgbImage;
use tch::{Device, Kind, Tensor};

/// The script's `PROMPTS`.
const PROMPTS: [&str; 2] = [
    "a red circle next to a blue square",
    "一只猫坐在垫子上, \"OPEN\" 24/7, with a longer caption than the first prompt has",
];

fn grids(t: &Tensor) -> Vec<(i64, i64, i64)> {
    let v = Vec::<i64>::try_from(t.reshape([-1])).expect("grid_thw i64");
    v.chunks(3).map(|g| (g[0], g[1], g[2])).collect()
}

/// Rows of `states` where `mask` (B, L) is 1, flattened (padding carries no value).
fn kept(states: &Tensor, mask: &Tensor) -> Tensor {
    states.masked_select(&mask.ne(0).unsqueeze(-1)).view([-1, states.size()[2]])
}

#[test]
fn vision_tower_and_states_with_pictures_match_transformers() {
    let io = tensors("qwen3_vl_tiny_io.safetensors");
    let model =
        Qwen3VlEncoder::load(&dir().join("qwen3_vl_tiny"), Device::Cpu, Kind::Float).expect("load");
    assert_eq!(model.mrope_section, [4, 2, 2]);
    assert_eq!(model.vision.config.deepstack_visual_indexes, [0, 2]);
    let mut check = Checker::new("qwen3_vl_tiny_io.safetensors");
    check.case();
    let grid = grids(&io["input.image_grid_thw"]);
    let features =
        tch::no_grad(|| model.vision.forward(&io["input.pixel_values"], &grid)).expect("tower");
    check.close_within("image_embeds", &features.embeds, &io["output.image_embeds"], MATH_RTOL);
    assert_eq!(features.deepstack.len(), 2);
    for (k, feature) in features.deepstack.iter().enumerate() {
        let want = &io[&format!("output.deepstack.{k}")];
        check.close_within(&format!("deepstack.{k}"), feature, want, MATH_RTOL);
    }
    check.case();
    let (ids, mask) = (&io["input.input_ids"], &io["input.attention_mask"]);
    let states = tch::no_grad(|| model.last_layer_with_pictures(ids, mask, &features, &grid))
        .expect("states");
    let want = kept(&io["output.last_layer"], mask);
    check.close_within("last_layer", &kept(&states, mask), &want, MATH_RTOL);
    check.finish();
}

fn picture(t: &Tensor) -> RgbImage {
    let (h, w) = (t.size()[0] as u32, t.size()[1] as u32);
    RgbImage::from_raw(w, h, Vec::<u8>::try_from(t.reshape([-1])).expect("u8")).expect("RGB")
}

/// `__call__`'s resize of a condition picture at `output_resolution` 96.
fn at_96(p: &RgbImage) -> RgbImage {
    let (w, h) = calculate_dimensions(96.0 * 96.0, p.width() as f64 / p.height() as f64);
    resize(p, w, h, Filter::Lanczos)
}

#[test]
fn prompt_encoding_with_condition_images_matches_the_pipeline() {
    let io = tensors("qwen_image21_images_io.safetensors");
    let pipe = QwenImage21Pipeline::load(
        &dir().join("qwen_image21_pipeline"),
        &PipelineOptions::new(Device::Cpu),
    )
    .expect("load");
    let mut check = Checker::new("qwen_image21_images_io.safetensors prompts");
    for (name, keys) in [("one", "a"), ("two", "ab")] {
        check.case();
        let pictures: Vec<RgbImage> =
            keys.chars().map(|k| at_96(&picture(&io[&format!("input.picture_{k}")]))).collect();
        let states =
            tch::no_grad(|| pipe.text.as_ref().expect("text encoder").encode(&PROMPTS, &pictures))
                .expect("encode");
        let want = &io[&format!("output.{name}_embeds")];
        let mask = io.get(&format!("output.{name}_mask")).expect("prompts of different lengths");
        assert!(states.mask.as_ref().expect("a mask").equal(mask), "{name} mask");
        check.close_within(
            &format!("{name}_embeds"),
            &kept(&states.embeds, mask),
            &kept(want, mask),
            MATH_RTOL,
        );
        let slots = &io[&format!("output.{name}_image_pad_mask")];
        assert!(states.image_slots.equal(slots), "{name} image_pad_mask");
        println!("{name}: {} slots", slots.get(0).sum(Kind::Int64).int64_value(&[]));
    }
    check.finish();
}

/// What the tower and encoder do not run is refused naming the file and key: another vision
/// activation or rotary type, a non-square position table, interleaved sections that do not cover
/// the head; a processor that would resize the pipeline's condition pictures (their encoder
/// slots would no longer match the VAE's tokens).
#[test]
fn unsupported_settings_are_refused_by_name() {
    use flowtune_models::text_encoders::qwen3_vl_vision::Qwen3VlVisionConfig;
    use flowtune_models::FlowPipeline;

    let scratch = flowtune_fixtures::scratch("qwen3-vl-refusals");
    let config = scratch.join("config.json");
    for (vision, key) in [
        (r#"{"hidden_act": "silu"}"#, "hidden_act `silu`"),
        (r#"{"rope_parameters": {"rope_type": "default"}}"#, "rope_type `default`"),
        (r#"{"num_position_embeddings": 12}"#, "num_position_embeddings 12"),
        (r#"{"depth": 2, "deepstack_visual_indexes": [1, 2]}"#, "block 2 is beyond depth 2"),
    ] {
        std::fs::write(&config, format!(r#"{{"vision_config": {vision}}}"#)).expect("write");
        let err = Qwen3VlVisionConfig::from_file(&config).expect_err(key).to_string();
        assert!(err.contains(key) && err.contains("config.json"), "{err}");
    }
    let copy = scratch.join("qwen3_vl_tiny");
    std::fs::create_dir_all(&copy).expect("mkdir");
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(dir().join("qwen3_vl_tiny").join(file), copy.join(file)).expect("copy");
    }
    let text = std::fs::read_to_string(copy.join("config.json")).expect("read");
    std::fs::write(
        copy.join("config.json"),
        text.replace("\"mrope_section\": [\n        4,", "\"mrope_section\": [\n        3,"),
    )
    .expect("write");
    let err = Qwen3VlEncoder::load(&copy, Device::Cpu, Kind::Float).err().expect("7 of 8");
    assert!(err.to_string().contains("mrope_section [3, 2, 2]"), "{err}");

    let pipeline = scratch.join("pipeline");
    copy_dir(&dir().join("qwen_image21_pipeline"), &pipeline);
    let processor = pipeline.join("processor/processor_config.json");
    let text = std::fs::read_to_string(&processor).expect("read");
    std::fs::write(&processor, text.replace("\"shortest_edge\": 3136", "\"shortest_edge\": 65536"))
        .expect("write");
    let options =
        PipelineOptions { output_resolution: Some(64), ..PipelineOptions::new(Device::Cpu) };
    let pipe = QwenImage21Pipeline::load(&pipeline, &options).unwrap();
    let shape = pipe.latent_shape(64, 64).expect("shape");
    let picture = image::RgbaImage::new(64, 64);
    let err = pipe.encode_prompts_with_pictures(&["x"], &[picture], &shape).err().expect("resized");
    assert!(err.to_string().contains("resized the condition pictures"), "{err}");
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let path = entry.expect("entry").path();
        let target = to.join(path.file_name().expect("name"));
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).expect("copy");
        }
    }
}

/// The released Qwen-Image 2.1 text encoder's vision settings (Qwen3-VL-8B's) are ones the tower
/// runs.
#[test]
fn the_released_vision_config_is_read() {
    use flowtune_models::text_encoders::qwen3_vl_vision::Qwen3VlVisionConfig;

    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let file = examples.join("models/qwen-image-2.1/text_encoder/config.json");
    let config = Qwen3VlVisionConfig::from_file(&file).expect("released config");
    assert_eq!(config.deepstack_visual_indexes, [8, 16, 24]);
    assert_eq!((config.depth, config.head_dim(), config.patch_dim()), (27, 72, 1536));
    assert_eq!((config.num_position_embeddings, config.out_hidden_size), (2304, 4096));
}

/// Pillow's resize of an RGBA picture (through premultiplied alpha) and its compositing over
/// white, byte for byte: what `__call__` feeds the VAE and the encoder.
#[test]
fn rgba_pictures_resize_and_composite_as_pillow() {
    use flowtune_models::resize::{over_white, resize_rgba};

    let io = tensors("qwen_image21_images_io.safetensors");
    let t = &io["input.picture_rgba"];
    let (h, w) = (t.size()[0] as u32, t.size()[1] as u32);
    let bytes = Vec::<u8>::try_from(t.reshape([-1])).expect("u8");
    let rgba = image::RgbaImage::from_raw(w, h, bytes).expect("RGBA");
    let (cw, ch) = calculate_dimensions(64.0 * 64.0, w as f64 / h as f64);
    let sized = resize_rgba(&rgba, cw, ch, Filter::Lanczos);
    let want = &io["output.rgba_resized"];
    let got = Tensor::from_slice(sized.as_raw()).view([ch as i64, cw as i64, 4]);
    assert!(got.equal(want), "resized RGBA differs from Pillow's");
    let seen = over_white(&sized);
    let got = Tensor::from_slice(seen.as_raw()).view([ch as i64, cw as i64, 3]);
    assert!(got.equal(&io["output.rgba_over_white"]), "composite differs from Pillow's");
    let alphas = io["output.rgba_resized"].select(2, 3);
    let translucent = alphas.gt(0).logical_and(&alphas.lt(255)).sum(Kind::Int64).int64_value(&[]);
    assert!(translucent > 0, "the picture has translucent pixels");
}

/// In bf16 (tower, language model, transformer and VAE) condition images encode close to the f32
/// run: the dtype casts of the tower's positions and rotary angles, the merged and deepstack
/// features and the VAE's condition tokens hold.
#[test]
fn condition_images_encode_in_bf16() {
    use flowtune_models::qwen_image::CONDITION_LATENTS;
    use flowtune_models::{Dtypes, FlowPipeline};

    let io = tensors("qwen_image21_images_io.safetensors");
    let path = dir().join("qwen_image21_pipeline");
    let pictures: Vec<image::RgbaImage> = "ab"
        .chars()
        .map(|k| image::DynamicImage::ImageRgb8(picture(&io[&format!("input.picture_{k}")])))
        .map(|p| p.to_rgba8())
        .collect();
    let encode = |kind: Kind| {
        let options = PipelineOptions {
            dtypes: Dtypes::all(kind),
            output_resolution: Some(96),
            ..PipelineOptions::new(Device::Cpu)
        };
        let pipe = QwenImage21Pipeline::load(&path, &options).expect("load");
        let shape = pipe.latent_shape(96, 96).expect("shape");
        tch::no_grad(|| pipe.encode_prompts_with_pictures(&PROMPTS, &pictures, &shape))
            .expect("encode")
    };
    let (full, half) = (encode(Kind::Float), encode(Kind::BFloat16));
    assert_eq!(half.embeds.kind(), Kind::BFloat16);
    let relative = |a: &Tensor, b: &Tensor| {
        let (a, b) = (a.to_kind(Kind::Float), b.to_kind(Kind::Float));
        (
            (&a - &b).norm().double_value(&[]) / b.norm().double_value(&[]),
            a.isfinite().all().int64_value(&[]),
        )
    };
    let (embeds, finite) = relative(&half.embeds, &full.embeds);
    assert!(finite == 1 && embeds < 5e-2, "bf16 states off by {embeds:.2e}");
    let (latents, finite) =
        relative(&half.extras[CONDITION_LATENTS], &full.extras[CONDITION_LATENTS]);
    assert!(finite == 1 && latents < 5e-2, "bf16 condition latents off by {latents:.2e}");
    println!("bf16 vs f32: states {embeds:.2e}, condition latents {latents:.2e}");
}
