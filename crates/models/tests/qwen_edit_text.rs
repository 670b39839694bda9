//! Qwen2.5-VL's language model with condition pictures (3-D positions) and Qwen-Image-Edit-Plus
//! prompt encoding against transformers/diffusers (`scripts/reference_qwen_edit_text.py`).

use std::collections::HashMap;

use flowtune_fixtures::{dir, tensors, Checker};
use flowtune_models::text_encoders::qwen2_5_vl::{Qwen25VlTextConfig, Qwen25VlTextEncoder};
use flowtune_models::text_encoders::qwen2_5_vl_positions::multimodal_positions;
use flowtune_models::text_encoders::qwen_edit_prompts::{ConditionPicture, QwenEditPromptEncoder};
use flowtune_models::ModelError;
use tch::{Device, Kind, Tensor};

const IO: &str = "qwen_edit_text_io.safetensors";
/// (case, prompt, pictures), as in the script's `EDIT_CASES`.
const EDIT_CASES: &[(&str, &str, &[&str])] = &[
    ("one", "make the cat red", &["square"]),
    ("two", "put the dog from picture 2 next to the cat", &["square", "wide"]),
    ("none", "a cat", &[]),
];
const MERGE: i64 = 2;

fn text_encoder_dir() -> std::path::PathBuf {
    dir().join("qwen_image_pipeline").join("text_encoder")
}

fn grids(t: &Tensor) -> Vec<(i64, i64, i64)> {
    let v = Vec::<i64>::try_from(t.reshape([-1])).expect("grid_thw i64");
    v.chunks(3).map(|g| (g[0], g[1], g[2])).collect()
}

#[test]
fn positions_match_get_rope_index() {
    let io = tensors(IO);
    let model = Qwen25VlTextEncoder::load(&text_encoder_dir(), Device::Cpu, Kind::Float).unwrap();
    let (ids, mask) = (&io["lm.input_ids"], &io["lm.attention_mask"]);
    let grid = grids(&io["lm.image_grid_thw"]);
    let image_token = model.config.image_token_id;
    let positions = multimodal_positions(ids, mask, image_token, &grid, MERGE).expect("positions");
    assert_eq!(positions, io["lm.position_ids"]);

    let err = multimodal_positions(ids, mask, image_token, &grid[..1], MERGE).expect_err("short");
    assert!(matches!(err, ModelError::Input(_)), "{err}");
    let extra = [grid.clone(), grid.clone()].concat();
    let err = multimodal_positions(ids, mask, image_token, &extra, MERGE).expect_err("unused");
    assert!(err.to_string().contains("left without image tokens"), "{err}");
}

#[test]
fn hidden_states_with_pictures_match_transformers() {
    let io = tensors(IO);
    let model = Qwen25VlTextEncoder::load(&text_encoder_dir(), Device::Cpu, Kind::Float).unwrap();
    let (ids, mask, embeds) =
        (&io["lm.input_ids"], &io["lm.attention_mask"], &io["lm.image_embeds"]);
    let grid = grids(&io["lm.image_grid_thw"]);
    let mut check = Checker::new("qwen_edit_text_io.safetensors lm.hidden_states");
    check.case();
    let out = tch::no_grad(|| model.forward_multimodal(ids, mask, embeds, &grid, MERGE))
        .expect("forward");
    check.close("lm.hidden_states", &out, &io["lm.hidden_states"]);
    check.finish();

    let short = embeds.narrow(0, 1, embeds.size()[0] - 1);
    let err = model.forward_multimodal(ids, mask, &short, &grid, MERGE).expect_err("count");
    assert!(err.to_string().contains("image_embeds"), "{err}");
}

fn pictures(io: &HashMap<String, Tensor>, names: &[&str]) -> Vec<(usize, usize, Vec<u8>)> {
    names
        .iter()
        .map(|n| {
            let p = &io[&format!("pictures.{n}")];
            let (h, w) = (p.size()[0] as usize, p.size()[1] as usize);
            (h, w, Vec::<u8>::try_from(p.reshape([-1])).expect("u8 picture"))
        })
        .collect()
}

#[test]
fn edit_prompt_embeds_match_diffusers() {
    let io = tensors(IO);
    let pipeline = dir().join("qwen_image_pipeline");
    let encoder = QwenEditPromptEncoder::load(
        &pipeline.join("text_encoder"),
        &pipeline.join("tokenizer"),
        &dir().join("qwen_vision_processor"),
        Device::Cpu,
        Kind::Float,
    )
    .expect("load");
    let mut check = Checker::new("qwen_edit_text_io.safetensors edit.*");
    for (case, prompt, names) in EDIT_CASES {
        let owned = pictures(&io, names);
        let pics: Vec<ConditionPicture<'_>> = owned
            .iter()
            .map(|(height, width, rgb)| ConditionPicture { height: *height, width: *width, rgb })
            .collect();
        let (ref_embeds, ref_mask) =
            (&io[&format!("edit.{case}.embeds")], &io[&format!("edit.{case}.mask")]);
        check.case();
        let (embeds, mask) =
            tch::no_grad(|| encoder.encode_prompts(&[prompt], &pics)).expect("encode");
        assert_eq!(mask, *ref_mask, "{case} mask");
        check.close(&format!("edit.{case}.embeds"), &embeds, ref_embeds);

        // a batch sharing the pictures: each row as if alone, zero-padded
        check.case();
        let (embeds, mask) =
            tch::no_grad(|| encoder.encode_prompts(&["x", prompt], &pics)).expect("batch");
        let n = ref_mask.size()[1];
        assert_eq!(mask.get(1).narrow(0, 0, n), ref_mask.get(0), "{case} batch mask");
        check.close(&format!("edit.{case} batch row"), &embeds.get(1).narrow(0, 0, n), ref_embeds);
    }
    check.finish();
}

#[test]
fn names_a_bad_mrope_section() {
    let scratch = flowtune_fixtures::scratch("qwen-mrope");
    let config = scratch.join("config.json");
    let text = r#"{"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rope_scaling": {"type": "default", "mrope_section": [1, 1, 1]}}"#;
    std::fs::write(&config, text).expect("write");
    let err = Qwen25VlTextConfig::from_file(&config).expect_err("sections sum to 3, not 4");
    assert!(err.to_string().contains("mrope_section [1, 1, 1]"), "{err}");
}
