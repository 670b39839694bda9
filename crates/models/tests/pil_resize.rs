//! `flowtune_models::resize` against Pillow's `Image.resize` (`scripts/reference_pil_resize.py`):
//! every pixel equal, for Lanczos, bicubic and bilinear, up, down and mixed.

use flowtune_fixtures::tensors;
use flowtune_models::resize::{resize, Filter};
use image::RgbImage;

#[test]
fn resize_equals_pillow_exactly() {
    let io = tensors("pil_resize.safetensors");
    let cases = io.keys().filter(|k| k.ends_with(".in")).count();
    assert!(cases >= 17, "{cases} cases");
    for i in 0..cases {
        let (input, want) = (&io[&format!("{i}.in")], &io[&format!("{i}.out")]);
        let filter = match io[&format!("{i}.filter")].int64_value(&[0]) {
            0 => Filter::Bicubic,
            1 => Filter::Lanczos,
            _ => Filter::Bilinear,
        };
        let picture = |t: &tch::Tensor| {
            let (h, w, _) = t.size3().unwrap();
            RgbImage::from_raw(w as u32, h as u32, Vec::<u8>::try_from(t.flatten(0, -1)).unwrap())
                .unwrap()
        };
        let (source, expected) = (picture(input), picture(want));
        let got = resize(&source, expected.width(), expected.height(), filter);
        let off = got.as_raw().iter().zip(expected.as_raw()).filter(|(a, b)| a != b).count();
        assert_eq!(off, 0, "case {i} ({filter:?}): {off} of {} values differ", got.as_raw().len());
    }
}
