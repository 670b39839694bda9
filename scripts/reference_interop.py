"""Interop fixtures: checkpoints and adapters as diffusers 0.42, transformers 5 and PEFT save them (issue 33).

Usage (the project's reference venv: torch, diffusers, transformers, peft):
    python scripts/reference_interop.py cfg fixtures
    python scripts/reference_interop.py clip fixtures
    python scripts/reference_interop.py lora fixtures

cfg: `ZImagePipeline.__call__` on `fixtures/z_image_pipeline` (4 Euler steps, given initial latents, output_type
    "latent") at guidance 0, 0.5, 1 and 3 -> `z_image_cfg_io.safetensors` (`input.initial_latents`,
    `output.final_latents.g<scale with p for .>`). diffusers runs CFG whenever guidance_scale > 0.
"""
import os
import sys

import torch
from safetensors.torch import save_file

CFG_PROMPTS = ["a red circle next to a blue square", "a cat on a mat"]
CFG_SCALES = [0.0, 0.5, 1.0, 3.0]


def scale_key(g):
    return "g" + f"{g}".replace(".", "p")


def cfg(out_dir):
    from diffusers import ZImagePipeline

    pipe = ZImagePipeline.from_pretrained(os.path.join(out_dir, "z_image_pipeline"))
    h, w = 16, 24
    f = pipe.vae_scale_factor
    g = torch.Generator().manual_seed(11)
    x = torch.randn(len(CFG_PROMPTS), pipe.transformer.in_channels, h // f, w // f, generator=g)
    io = {"input.initial_latents": x.clone()}
    for scale in CFG_SCALES:
        with torch.no_grad():
            # A copy: the pipeline writes the chat template into the list it is given.
            out = pipe(list(CFG_PROMPTS), height=h, width=w, num_inference_steps=4, guidance_scale=scale,
                       latents=x.clone(), output_type="latent", return_dict=False)[0]
        io[f"output.final_latents.{scale_key(scale)}"] = out
    path = os.path.join(out_dir, "z_image_cfg_io.safetensors")
    save_file({k: v.contiguous() for k, v in io.items()}, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    {"cfg": cfg}[sys.argv[1]](sys.argv[2])
