//! FLUX.2 [dev] prompt encoding against `scripts/reference_flux2_dev.py` on the tiny pipeline of
//! `flowtune make-tiny flux2 --dev`: the PixtralProcessor's ids and masks of Mistral's system and
//! user turns (left-padded to `max_sequence_length`, one row truncated, `[IMG]` dropped, an empty
//! prompt) and the stacked Mistral hidden states 10, 20, 30; the distilled guidance rides as an
//! extra and no CFG runs.

use flowtune_fixtures::{dir, tensors, Checker, MODEL_RTOL};
use flowtune_models::flux::GUIDANCE;
use flowtune_models::flux2::Flux2Pipeline;
use flowtune_models::{FlowPipeline, PipelineOptions};
use tch::{Device, Kind};

const PROMPTS: [&str; 4] = [
    "a red circle next to a blue square",
    "一只猫坐在垫子上, \"OPEN\" 24/7, with a long caption that runs past the sequence length of \
     the tiny pipeline so that this row is truncated before its end",
    "a cat [IMG] on a mat",
    "",
];
const LENGTH: usize = 112;

fn tiny_dev(guidance: Option<f64>) -> Flux2Pipeline {
    let options = PipelineOptions {
        max_sequence_length: Some(LENGTH),
        embedded_guidance: guidance,
        ..PipelineOptions::new(Device::Cpu)
    };
    Flux2Pipeline::load(&dir().join("flux2_dev_pipeline"), &options).expect("load")
}

#[test]
fn dev_prompt_encoding_matches_the_pipeline() {
    let io = tensors("flux2_dev_pipeline_io.safetensors");
    let pipe = tiny_dev(None);
    let mut check = Checker::new("flux2_dev_pipeline_io.safetensors prompts");
    check.case();
    let (ids, mask) =
        pipe.text.as_ref().expect("text encoder").tokenize(&PROMPTS, LENGTH).expect("tokenize");
    assert!(ids.equal(&io["output.prompt_ids"]), "ids\n{ids}\n{}", io["output.prompt_ids"]);
    assert!(mask.equal(&io["output.prompt_mask"]), "masks");
    let lengths = Vec::<i64>::try_from(mask.sum_dim_intlist(1, false, Kind::Int64)).unwrap();
    assert!(lengths[1] == LENGTH as i64 && lengths[3] < lengths[0], "{lengths:?}");
    assert_eq!(mask.get(3).get(0).int64_value(&[]), 0, "padding on the left");
    let text = tch::no_grad(|| pipe.encode_prompts(&PROMPTS)).expect("encode");
    assert!(text.mask.is_none(), "the transformer attends to every token");
    check.close_within("prompt_embeds", &text.embeds, &io["output.prompt_embeds"], MODEL_RTOL);
    let guidance = Vec::<f64>::try_from(&text.extras[GUIDANCE]).unwrap();
    assert_eq!(guidance, [4.0; 4], "Flux2Pipeline's default guidance_scale");
    assert!(pipe.embeds_guidance() && !pipe.denoiser().runs_cfg(4.0), "[dev] runs no CFG");
    let text = tch::no_grad(|| tiny_dev(Some(2.5)).encode_prompts(&PROMPTS[..1])).unwrap();
    assert_eq!(Vec::<f64>::try_from(&text.extras[GUIDANCE]).unwrap(), [2.5]);
    check.finish();
}
