"""Reference numbers for flowtune's SD3 prompt encoding, from diffusers.

Usage (needs `pip install torch diffusers transformers`):
    flowtune make-tiny sd3 /tmp/tiny --seed 1
    python scripts/reference_sd3_prompts.py /tmp/tiny fixtures/sd3_tiny_pipeline_prompts.safetensors

Writes, for the prompts below (T5 length 12): input ids of the three tokenizers and
`encode_prompt`'s prompt_embeds / pooled_prompt_embeds (and the negatives for "").
"""
import sys

import torch
from diffusers import StableDiffusion3Pipeline
from safetensors.torch import save_file

PROMPTS = ["a red circle", "Two BLUE squares, left of a triangle!", ""]
T5_LENGTH = 12


def main(pipeline_dir, out):
    pipe = StableDiffusion3Pipeline.from_pretrained(pipeline_dir)
    tensors = {}
    for name, tok, length in [("tokenizer", pipe.tokenizer, 77), ("tokenizer_2", pipe.tokenizer_2, 77), ("tokenizer_3", pipe.tokenizer_3, T5_LENGTH)]:
        ids = tok(PROMPTS, padding="max_length", max_length=length, truncation=True, return_tensors="pt").input_ids
        tensors[f"{name}.input_ids"] = ids.to(torch.int64)
    with torch.no_grad():
        pe, npe, pp, npp = pipe.encode_prompt(PROMPTS, None, None, negative_prompt=[""] * len(PROMPTS), max_sequence_length=T5_LENGTH)
    tensors.update({"prompt_embeds": pe, "pooled_prompt_embeds": pp, "negative_prompt_embeds": npe, "negative_pooled_prompt_embeds": npp})
    save_file({k: v.contiguous() for k, v in tensors.items()}, out)
    print(f"wrote {out}: " + ", ".join(f"{k} {tuple(v.shape)}" for k, v in tensors.items()))


if __name__ == "__main__":
    main(*sys.argv[1:3])
