//! A `make-tiny` SD3 pipeline (seed 1, the same on every machine) loaded as a whole: its
//! tokenizers and prompt encoding match diffusers' `encode_prompt` on the same directory
//! (`fixtures/sd3_tiny_pipeline_prompts.safetensors`, made by `scripts/reference_sd3_prompts.py`).

use flowtune_fixtures::{tensors, Checker, MODEL_RTOL};
use flowtune_models::sd3::{write_tiny_sd3, Dtypes, Sd3Pipeline, TinySd3Spec};
use tch::{Device, Kind};

const PROMPTS: [&str; 3] = ["a red circle", "Two BLUE squares, left of a triangle!", ""];

#[test]
fn tiny_pipeline_encodes_prompts_like_diffusers() {
    let dir = std::env::temp_dir().join(format!("flowtune-tiny-sd3-{}", std::process::id()));
    write_tiny_sd3(&dir, &TinySd3Spec { seed: 1, ..Default::default() }).expect("make-tiny");
    let mut pipe = Sd3Pipeline::load(&dir, Device::Cpu, Dtypes::all(Kind::Float), None)
        .expect("load pipeline");
    pipe.t5_max_length = 12;
    let want = tensors("sd3_tiny_pipeline_prompts.safetensors");
    let mut check = Checker::new("sd3_tiny_pipeline_prompts.safetensors");
    check.case();
    let (l, g, t5) =
        (&pipe.clip_l.tokenizer, &pipe.clip_g.tokenizer, &pipe.t5.as_ref().expect("t5").0);
    for (name, tok, len) in [("tokenizer", l, 77), ("tokenizer_2", g, 77), ("tokenizer_3", t5, 12)]
    {
        let ids = tok.encode(&PROMPTS, len).expect("tokenize");
        if !ids.equal(&want[&format!("{name}.input_ids")]) {
            check.fail(format!("{name}: ids differ from transformers'"));
        }
    }
    let text = tch::no_grad(|| pipe.encode_prompts(&PROMPTS)).expect("encode");
    check.close_within("prompt_embeds", &text.embeds, &want["prompt_embeds"], MODEL_RTOL);
    check.close_within(
        "pooled_prompt_embeds",
        text.pooled.as_ref().unwrap(),
        &want["pooled_prompt_embeds"],
        MODEL_RTOL,
    );
    let negative = tch::no_grad(|| pipe.encode_prompts(&["", "", ""])).expect("encode");
    check.close_within(
        "negative_prompt_embeds",
        &negative.embeds,
        &want["negative_prompt_embeds"],
        MODEL_RTOL,
    );

    // The whole pipeline runs: one velocity, then VAE decode to u8 RGB at 2× the latent size.
    let latents = tch::Tensor::randn([3, 4, 8, 12], (Kind::Float, Device::Cpu));
    let t = tch::Tensor::from_slice(&[1000.0f32, 500.0, 10.0]);
    let v = tch::no_grad(|| {
        pipe.transformer.forward(&latents, &text.embeds, text.pooled.as_ref().unwrap(), &t)
    })
    .expect("velocity");
    assert_eq!(v.size(), [3, 4, 8, 12]);
    let rgb = tch::no_grad(|| pipe.decode_rgb8(&latents));
    assert_eq!((rgb.size(), rgb.kind()), (vec![3, 16, 24, 3], Kind::Uint8));
    let _ = std::fs::remove_dir_all(&dir);
    check.finish();
}
