//! Greedy answers and score-token probabilities of a [`VisionLanguageModel`], batched: one
//! prefill of the left-padded prompts, then one token per step for the rows still answering,
//! with a key-value cache. A row stops at an end-of-answer token (kept out of its answer) or
//! after `max_new_tokens`; finished rows leave the batch.

use tch::{Kind, Tensor};

use super::{Prompts, VisionLanguageModel};
use crate::ModelError;

/// The greedy answers (new token ids, without the end-of-answer token) of `prompts`, at most
/// `max_new_tokens` each — transformers' `generate(do_sample=False)`.
pub fn generate(
    model: &VisionLanguageModel,
    prompts: &Prompts,
    max_new_tokens: usize,
) -> Result<Vec<Vec<i64>>, ModelError> {
    let b = prompts.input_ids.size()[0] as usize;
    let mut answers = vec![vec![]; b];
    if max_new_tokens == 0 || b == 0 {
        return Ok(answers);
    }
    let device = model.device();
    let eos = Tensor::from_slice(&model.eos_token_ids).to_device(device);
    let (states, mut cache, mut positions) = model.prefill(prompts)?;
    let mut next = model.logits(&states.select(1, -1)).argmax(-1, false);
    let mut keys = prompts.attention_mask.shallow_clone();
    // The batch rows still answering, as indices into `answers`.
    let mut rows: Vec<usize> = (0..b).collect();
    for step in 0..max_new_tokens {
        let tokens = Vec::<i64>::try_from(&next)?;
        let ended = Tensor::isin(&next, &eos, false, false);
        let ended = Vec::<bool>::try_from(&ended)?;
        let mut keep = vec![];
        for (slot, (&row, (&token, &done))) in
            rows.iter().zip(tokens.iter().zip(&ended)).enumerate()
        {
            if !done {
                answers[row].push(token);
                keep.push(slot as i64);
            }
        }
        if keep.is_empty() || step + 1 == max_new_tokens {
            break;
        }
        if keep.len() < rows.len() {
            let index = Tensor::from_slice(&keep).to_device(device);
            cache.keep_rows(&index);
            keys = keys.index_select(0, &index);
            positions = positions.index_select(0, &index);
            next = next.index_select(0, &index);
            rows = keep.iter().map(|&slot| rows[slot as usize]).collect();
        }
        let n = rows.len() as i64;
        keys = Tensor::cat(&[&keys, &Tensor::ones([n, 1], (keys.kind(), device))], 1);
        let logits = model.decode_step(&next.view([n, 1]), &keys, &positions, &mut cache)?;
        positions += 1;
        next = logits.select(1, -1).argmax(-1, false);
    }
    Ok(answers)
}

/// The probabilities (B, K) f32, over the whole vocabulary, of `token_ids` as each row's first
/// answer token: the expectation a judge's score tokens weigh.
pub fn first_token_probabilities(
    model: &VisionLanguageModel,
    prompts: &Prompts,
    token_ids: &[i64],
) -> Result<Tensor, ModelError> {
    let (states, _, _) = model.prefill(prompts)?;
    let last = model.logits(&states.select(1, -1)).to_kind(Kind::Float).softmax(-1, Kind::Float);
    let index = Tensor::from_slice(token_ids).to_device(last.device());
    Ok(last.index_select(1, &index))
}
