//! A Qwen2-VL preference model as HPSv3 runs one, against its architecture written out over
//! transformers (`scripts/reference_preference_model.py`): the head's outputs at the reward token
//! of four pictures of different sizes in one right-padded batch, and the Qwen2-VL vision tower's
//! merged embeddings, ≤ 1e-4 relative; and the refusal of a prompt without the reward token.

use flowtune_fixtures::{dir, json, tensors, Checker, MATH_RTOL};
use flowtune_models::text_encoders::qwen2_vl_vision::Qwen2VlVision;
use flowtune_models::vlm::preference::PreferenceModel;
use image::RgbImage;
use tch::{Device, Kind, Tensor};

fn picture(t: &Tensor) -> RgbImage {
    let (h, w) = (t.size()[0] as u32, t.size()[1] as u32);
    RgbImage::from_raw(w, h, Vec::<u8>::try_from(t.reshape([-1])).expect("u8")).expect("RGB")
}

#[test]
fn qwen2_vl_preference_model_matches_its_reference() {
    let spec = json("preference.json");
    let folder = dir().join(spec["model"].as_str().unwrap());
    let model = PreferenceModel::load(&folder, Device::Cpu, Kind::Float, 2).expect("load");
    let judge_io = tensors("vlm_judge_io.safetensors");
    let pictures: Vec<RgbImage> =
        (0..4).map(|i| picture(&judge_io[&format!("picture{i}")])).collect();
    let users: Vec<&str> =
        spec["user"].as_array().unwrap().iter().map(|u| u.as_str().unwrap()).collect();
    let rows: Vec<_> = pictures.iter().zip(&users).map(|(p, u)| (p, *u)).collect();
    let scores = model.score(&rows).expect("scores");
    let mut check = Checker::new("preference_io.safetensors");
    check.case();
    let io = tensors("preference_io.safetensors");
    check.close_within("scores", &scores, &io["scores"], MATH_RTOL);
    check.case();
    let tower = Qwen2VlVision::load(&folder, Device::Cpu, Kind::Float).expect("tower");
    let grids = Vec::<i64>::try_from(io["image_grid_thw"].reshape([-1])).unwrap();
    let grids: Vec<_> = grids.chunks(3).map(|g| (g[0], g[1], g[2])).collect();
    let embeds = tch::no_grad(|| tower.forward(&io["pixel_values"], &grids)).expect("embeds");
    check.close_within("image_embeds", &embeds, &io["image_embeds"], MATH_RTOL);
    check.finish();
    let err = model.score(&[(&pictures[0], "no reward token here")]).err().unwrap().to_string();
    assert!(err.contains("holds 0 <|Reward|> tokens"), "{err}");
}
