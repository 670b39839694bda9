"""Reference fixtures for FLUX.2 [dev] (diffusers' Flux2Pipeline with a Mistral3 text encoder).

Usage (the project's reference venv: torch, torchvision, diffusers, transformers):
    flowtune make-tiny flux2 --dev fixtures/flux2_dev_pipeline
    python scripts/reference_flux2_dev.py fixtures

Writes `flux2_dev_pipeline_io.safetensors`: the pipeline's prompt encoding (the PixtralProcessor's left-padded ids
and masks of the system + user chat turns of prompts of different lengths, one truncated, one holding `[IMG]`, one
empty, and the stacked Mistral hidden states 10/20/30 `encode_prompt` returns), and two whole ODE sampling runs of
`Flux2Pipeline.__call__` with given latents (guidance 4 embedded, no CFG; guidance 2.5 with two reference pictures):
the sigmas, the final latents (from the step callback) and the pictures.
"""
import os
import sys

import numpy as np
import PIL.Image
import torch
from safetensors.torch import save_file

PROMPTS = ["a red circle next to a blue square",
           "一只猫坐在垫子上, \"OPEN\" 24/7, with a long caption that runs past the sequence length of the tiny "
           "pipeline so that this row is truncated before its end",
           "a cat [IMG] on a mat",
           ""]
SPEC = dict(max_sequence_length=112, height=48, width=32, steps=4)


def main(out_dir):
    from diffusers import Flux2Pipeline
    from diffusers.pipelines.flux2.pipeline_flux2 import format_input

    pipe = Flux2Pipeline.from_pretrained(os.path.join(out_dir, "flux2_dev_pipeline"))
    s = SPEC
    n_len = s["max_sequence_length"]
    io = {}
    with torch.no_grad():
        tok = pipe.tokenizer.apply_chat_template(
            format_input(PROMPTS, system_message=pipe.system_message), add_generation_prompt=False, tokenize=True,
            return_dict=True, return_tensors="pt", padding="max_length", truncation=True, max_length=n_len)
        embeds, _ = pipe.encode_prompt(PROMPTS, device="cpu", max_sequence_length=n_len)
        io["output.prompt_ids"] = tok["input_ids"]
        io["output.prompt_mask"] = tok["attention_mask"]
        io["output.prompt_embeds"] = embeds

    g = torch.Generator().manual_seed(12)
    prompts = PROMPTS[:2]
    b, (h, w) = len(prompts), (s["height"], s["width"])
    f = pipe.vae_scale_factor * 2
    x = torch.randn(b, pipe.transformer.config.in_channels, h // f, w // f, generator=g)
    io["input.initial_latents"] = x
    refs = [torch.randint(0, 256, (70, 101, 3), generator=g, dtype=torch.uint8),
            torch.randint(0, 256, (66, 64, 3), generator=g, dtype=torch.uint8)]
    for i, r in enumerate(refs):
        io[f"input.reference_{i}"] = r
    pictures = [PIL.Image.fromarray(r.numpy()) for r in refs]
    for key, guidance, image in [("", 4.0, None), ("reference_", 2.5, pictures)]:
        final = {}

        def keep(pipe_, i, t, kwargs):
            final["latents"] = kwargs["latents"]
            return {}

        out = pipe(image=image, prompt=prompts, height=h, width=w, num_inference_steps=s["steps"],
                   guidance_scale=guidance, latents=x.clone(), max_sequence_length=n_len, output_type="np",
                   callback_on_step_end=keep).images
        io[f"output.{key}final_latents"] = final["latents"].transpose(1, 2).reshape(x.shape)
        io[f"output.{key}images"] = torch.from_numpy(np.ascontiguousarray(out))
        io[f"output.{key}sigmas"] = pipe.scheduler.sigmas.clone()
        io[f"input.{key}guidance"] = torch.tensor(guidance)
    path = os.path.join(out_dir, "flux2_dev_pipeline_io.safetensors")
    save_file({k: v.contiguous() for k, v in io.items()}, path)
    print(f"wrote {path}: {s}, mask rows {tok['attention_mask'].sum(1).tolist()}, "
          f"sigmas {[round(float(v), 4) for v in io['output.sigmas']]}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fixtures")
