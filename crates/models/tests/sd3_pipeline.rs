//! A `make-tiny` SD3 pipeline (seed 1, the same on every machine) loaded as a whole: its
//! tokenizers and prompt encoding match diffusers' `encode_prompt` on the same directory
//! (`fixtures/sd3_tiny_pipeline_prompts.safetensors`, made by `scripts/reference_sd3_prompts.py`).

use flowtune_fixtures::{tensors, Checker, MODEL_RTOL};
use flowtune_models::sd3::{write_tiny_sd3, Sd3Pipeline, TinySd3Spec};
use flowtune_models::{FlowPipeline, PipelineOptions};
use tch::{Device, Kind};

const PROMPTS: [&str; 3] = ["a red circle", "Two BLUE squares, left of a triangle!", ""];

#[test]
fn tiny_pipeline_encodes_prompts_like_diffusers() {
    let dir = flowtune_fixtures::scratch("tiny-sd3");
    write_tiny_sd3(&dir, &TinySd3Spec { seed: 1, ..Default::default() }).expect("make-tiny");
    let options =
        PipelineOptions { max_sequence_length: Some(12), ..PipelineOptions::new(Device::Cpu) };
    let pipe = Sd3Pipeline::load(&dir, &options).expect("load pipeline");
    let want = tensors("sd3_tiny_pipeline_prompts.safetensors");
    let mut check = Checker::new("sd3_tiny_pipeline_prompts.safetensors");
    check.case();
    let text = pipe.text.as_ref().expect("text encoders");
    let (l, g, t5) =
        (&text.clip_l.tokenizer, &text.clip_g.tokenizer, &text.t5.as_ref().expect("t5").0);
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
    let rgb = tch::no_grad(|| pipe.decode_rgb8(&latents)).expect("decode");
    assert_eq!((rgb.size(), rgb.kind()), (vec![3, 16, 24, 3], Kind::Uint8));
    check.finish();
}

/// A pipeline saved by current diffusers/transformers names its tokenizers `TokenizersBackend`;
/// any tokenizer class whose folder holds a `tokenizer.json` loads, through the registry.
#[test]
fn tokenizers_are_recognised_by_their_files_not_their_class() {
    let dir = flowtune_fixtures::scratch("tiny-backend");
    write_tiny_sd3(&dir, &TinySd3Spec { seed: 1, ..Default::default() }).expect("make-tiny");
    let index = dir.join("model_index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    let renamed = text
        .replace("CLIPTokenizer", "TokenizersBackend")
        .replace("T5Tokenizer", "TokenizersBackend");
    assert!(renamed.matches("TokenizersBackend").count() >= 3, "{renamed}");
    std::fs::write(&index, renamed).unwrap();
    let pipe = flowtune_models::load_pipeline(&dir, &PipelineOptions::new(Device::Cpu))
        .expect("a TokenizersBackend pipeline loads");
    let text = tch::no_grad(|| pipe.encode_prompts(&["a red circle"])).expect("encode");
    assert_eq!(text.embeds.size()[0], 1);
    // A tokenizer folder without tokenizer.json is refused, naming the folder and the class.
    std::fs::remove_file(dir.join("tokenizer_2/tokenizer.json")).unwrap();
    let err = flowtune_models::load_pipeline(&dir, &PipelineOptions::new(Device::Cpu))
        .err()
        .expect("no tokenizer.json")
        .to_string();
    assert!(
        err.contains("tokenizer_2")
            && err.contains("TokenizersBackend")
            && err.contains("has no tokenizer.json"),
        "{err}"
    );
}
