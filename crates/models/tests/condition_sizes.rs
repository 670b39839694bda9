//! `condition_sizes` (what `flowtune plan` counts for a row's condition pictures, from their sizes
//! alone) against what each tiny pipeline builds when it encodes the pictures: the image-stream
//! tokens of the encoded sizes, and the prompt's extra text tokens (vision tokens and markers).

use flowtune_fixtures::dir;
use flowtune_models::flux2::REFERENCE_TOKENS;
use flowtune_models::qwen_image::CONDITION_LATENTS;
use flowtune_models::{condition_sizes, load_pipeline, ConditionSizes, PipelineOptions};
use image::RgbaImage;
use tch::{Device, Kind};

/// A picture of `w` × `h` with some structure (the sizes are what matter).
fn picture(w: u32, h: u32) -> RgbaImage {
    RgbaImage::from_fn(w, h, |x, y| image::Rgba([(x * 7) as u8, (y * 5) as u8, 90, 255]))
}

/// Encodes one prompt with and without `sizes` pictures through the fixture pipeline `name`;
/// returns the planner's count, the pipeline's condition tokens, and the prompt's length with and
/// without the pictures.
fn encoded(
    name: &str,
    extra: &str,
    sizes: &[(u32, u32)],
    output_resolution: Option<u32>,
) -> (ConditionSizes, i64, (i64, i64)) {
    let path = dir().join(name);
    let options = PipelineOptions {
        output_resolution: output_resolution.map(i64::from),
        ..PipelineOptions::new(Device::Cpu)
    };
    let pipe = load_pipeline(&path, &options).expect("load");
    let pictures: Vec<RgbaImage> = sizes.iter().map(|&(w, h)| picture(w, h)).collect();
    let shape = pipe.latent_shape(64, 64).expect("shape");
    let (with, without) = tch::no_grad(|| {
        let with = pipe.encode_prompts_with_pictures(&["a red cube"], &pictures, &shape);
        (with.expect("encode with pictures"), pipe.encode_prompts(&["a red cube"]).unwrap())
    });
    let length = |t: &flowtune_models::TextConditioning| match &t.mask {
        Some(mask) => mask.to_kind(Kind::Int64).sum(Kind::Int64).int64_value(&[]),
        None => t.embeds.size()[1],
    };
    let tokens = with.extras[extra].size()[1];
    let planned =
        condition_sizes(&path, &[vec![], sizes.to_vec()], output_resolution).expect("sizes");
    assert!(planned[0].encoded.is_empty() && planned[0].text_tokens == 0, "{:?}", planned[0]);
    let planned = planned[1].clone();
    (planned, tokens, (length(&with), length(&without)))
}

/// Image-stream tokens of encoded sizes for a token side of `cell` pixels.
fn tokens(sizes: &ConditionSizes, cell: u32) -> i64 {
    sizes.encoded.iter().map(|&(w, h)| ((w / cell) * (h / cell)) as i64).sum()
}

#[test]
fn edit_plus_pictures_are_sized_as_the_pipeline_encodes_them() {
    // 4:3 and 1:2: VAE at about 1024² (1184 × 896, 736 × 1472), vision at about 384².
    let sizes = [(200, 150), (60, 120)];
    let (planned, tokens_built, (with, without)) =
        encoded("qwen_image_edit_pipeline", CONDITION_LATENTS, &sizes, None);
    assert_eq!(planned.encoded, vec![(1184, 896), (736, 1440)]);
    // 8× VAE, 2 × 2 packing.
    assert_eq!(tokens(&planned, 16), tokens_built);
    assert_eq!(planned.text_tokens as i64, with - without, "{planned:?}");
    assert!(planned.cut_at_max_sequence_length);
    // Two 384² views (14 × 14 merged patches each) pass the pipeline's 512 tokens: the prompt
    // with its pictures is cut there.
    let (planned, _, (with, without)) =
        encoded("qwen_image_edit_pipeline", CONDITION_LATENTS, &[(64, 64); 2], None);
    assert!(planned.text_tokens > 2 * 14 * 14, "{planned:?}");
    assert!(without + planned.text_tokens as i64 > 512 && with == 512, "{planned:?}");
}

#[test]
fn qwen_image21_pictures_are_sized_as_the_pipeline_encodes_them() {
    let sizes = [(96, 64), (64, 64)];
    let (planned, tokens_built, (with, without)) =
        encoded("qwen_image21_pipeline", CONDITION_LATENTS, &sizes, Some(96));
    assert_eq!(planned.encoded, vec![(128, 64), (96, 96)]);
    // 16× VAE, one token per latent cell.
    assert_eq!(tokens(&planned, 16), tokens_built);
    assert_eq!(planned.text_tokens as i64, with - without, "{planned:?}");
    assert!(!planned.cut_at_max_sequence_length, "the pipeline encodes whole prompts");
}

#[test]
fn flux2_reference_pictures_are_sized_as_the_pipeline_encodes_them() {
    let sizes = [(100, 70), (64, 80)];
    let (planned, tokens_built, (with, without)) =
        encoded("flux2_klein_pipeline", REFERENCE_TOKENS, &sizes, None);
    assert_eq!(with, without, "the prompt does not see reference pictures");
    assert_eq!(planned.text_tokens, 0);
    // The tiny VAE's two levels and the 2 × 2 patch: 4-pixel tokens, sizes cropped to them.
    assert_eq!(planned.encoded, vec![(100, 68), (64, 80)]);
    assert_eq!(tokens(&planned, 4), tokens_built);
}

#[test]
fn pictures_add_nothing_where_a_family_takes_none_or_holds_them() {
    let planned = condition_sizes(&dir().join("qwen_image_edit_pipeline"), &[vec![]], None);
    assert_eq!(planned.unwrap(), vec![ConditionSizes::default()]);
    let wan = condition_sizes(&dir().join("wan_a14b_pipeline"), &[vec![(64, 64)]], None);
    assert_eq!(wan.map_err(|e| e.to_string()), Ok(vec![ConditionSizes::default()]));
}
