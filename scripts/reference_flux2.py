"""Reference fixtures for FLUX.2 [klein] (diffusers' Flux2Transformer2DModel and Flux2KleinPipeline).

Usage (the project's reference venv: torch, diffusers, transformers, peft):
    flowtune make-tiny flux2 fixtures/flux2_klein_pipeline
    python scripts/reference_flux2.py fixtures

Writes, for each tiny random transformer config below (a [klein] one with reference-image tokens, a [dev] one with
the guidance embedding), `<name>/`, `<name>_lora.safetensors` and `<name>_io.safetensors` (`input.*` as diffusers'
forward takes them: `hidden_states` tokens, `timestep` as sigma, `img_ids` / `txt_ids` (S, 4) / (L, 4), `guidance` for
[dev]; outputs, LoRA outputs and gradients as `transformer_fixtures.lora_case` writes them), and updates the entries of
kind `flux2_transformer` in `manifest.json`.

From the tiny pipeline of `flowtune make-tiny flux2` it writes `flux2_klein_pipeline_io.safetensors`: the pipeline's
prompt encoding (ids, masks and embeds of prompts of different lengths padded to `max_sequence_length`, and of the
empty negative prompt), the VAE's encoding of u8 pictures (`_encode_vae_image`) and its decoding of latents as the
pipeline decodes them, and two whole ODE sampling runs of `Flux2KleinPipeline.__call__` with given latents (CFG 3, and
the same with `is_distilled`, which runs no CFG): the sigmas, the final latents (from the step callback) and the
pictures.
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import PIL.Image
import torch
from safetensors.torch import save_file

from transformer_fixtures import lora_case, randomize_, update_manifest

KLEIN_TARGETS = [
    "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
    "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
    "attn.to_qkv_mlp_proj", "ff.linear_in", "ff.linear_out", "ff_context.linear_in", "ff_context.linear_out",
]

CONFIGS = [
    {
        "name": "flux2_klein_tiny",
        "config": dict(num_layers=2, num_single_layers=2, num_attention_heads=2, attention_head_dim=16,
                       axes_dims_rope=(4, 4, 4, 4), joint_attention_dim=24, in_channels=32,
                       timestep_guidance_channels=32, guidance_embeds=False),
        # Non-square 3 x 5 latent tokens, then a 2 x 2 reference image at time 10; odd text length.
        "grid": (3, 5),
        "reference": (2, 2),
        "text_len": 7,
        "timesteps": [0.999, 0.3125],
        "guidance": None,
        "lora": {"r": 4, "alpha": 8, "targets": KLEIN_TARGETS},
    },
    {
        "name": "flux2_dev_tiny",
        "config": dict(num_layers=1, num_single_layers=2, num_attention_heads=3, attention_head_dim=8,
                       axes_dims_rope=(2, 2, 2, 2), joint_attention_dim=20, in_channels=16, mlp_ratio=2.5,
                       timestep_guidance_channels=16, guidance_embeds=True),
        "grid": (4, 2),
        "reference": None,
        "text_len": 5,
        "timesteps": [0.75, 0.05],
        "guidance": [4.0, 1.5],
        "lora": {"r": 3, "alpha": 6, "targets": "all-linear"},
    },
]

PROMPTS = ["a red circle next to a blue square",
           "一只猫坐在垫子上, \"OPEN\" 24/7, with a long caption that runs past the sequence length of the tiny "
           "pipeline so that this row is truncated"]
SPEC = dict(max_sequence_length=48, height=32, width=48, steps=4, guidance_scale=3.0)


def grid_ids(t, rows, cols):
    return torch.cartesian_prod(torch.tensor([t]), torch.arange(rows), torch.arange(cols), torch.arange(1)).float()


def transformer_case(spec, out_dir, g):
    from diffusers import Flux2Transformer2DModel

    name = spec["name"]
    model = Flux2Transformer2DModel(**spec["config"]).eval()
    randomize_(model, g)
    model.save_pretrained(os.path.join(out_dir, name), safe_serialization=True)
    c = model.config
    b = len(spec["timesteps"])
    rows, cols = spec["grid"]
    ids = grid_ids(0, rows, cols)
    if spec["reference"] is not None:
        ids = torch.cat([ids, grid_ids(10, *spec["reference"])])
    length = spec["text_len"]
    inp = {
        "hidden_states": torch.randn(b, ids.shape[0], c.in_channels, generator=g),
        "encoder_hidden_states": torch.randn(b, length, c.joint_attention_dim, generator=g),
        "timestep": torch.tensor(spec["timesteps"], dtype=torch.float32),
        "img_ids": ids,
        "txt_ids": torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(length)).float(),
    }
    if spec["guidance"] is not None:
        inp["guidance"] = torch.tensor(spec["guidance"], dtype=torch.float32)
    call = dict(inp, return_dict=False)
    with torch.no_grad():
        out = model(**call)[0]
    io = {f"input.{k}": v for k, v in inp.items()}
    io["output.sample"] = out
    return lora_case(model, lambda: model(**call)[0], name, "flux2_transformer", spec["lora"], io, out_dir, g)


def pipeline_case(pipeline_dir, out):
    from diffusers import Flux2KleinPipeline

    pipe = Flux2KleinPipeline.from_pretrained(pipeline_dir)
    s = SPEC
    n_len = s["max_sequence_length"]
    io = {}
    with torch.no_grad():
        for key, prompts in [("prompt", PROMPTS), ("negative_prompt", [""] * len(PROMPTS))]:
            texts = [pipe.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                        add_generation_prompt=True, enable_thinking=False)
                     for p in prompts]
            tok = pipe.tokenizer(texts, return_tensors="pt", padding="max_length", truncation=True, max_length=n_len)
            embeds, _ = pipe.encode_prompt(prompts, device="cpu", max_sequence_length=n_len)
            io[f"output.{key}_ids"] = tok["input_ids"]
            io[f"output.{key}_mask"] = tok["attention_mask"]
            io[f"output.{key}_embeds"] = embeds

        g = torch.Generator().manual_seed(11)
        b, (h, w) = len(PROMPTS), (s["height"], s["width"])
        f = pipe.vae_scale_factor * 2
        channels = pipe.transformer.config.in_channels
        pixels = torch.randint(0, 256, (b, h, w, 3), generator=g, dtype=torch.uint8)
        io["input.pixels"] = pixels
        io["output.encoded_latents"] = pipe._encode_vae_image(pixels.permute(0, 3, 1, 2).float() / 127.5 - 1, None)
        latents = torch.randn(b, channels, h // f, w // f, generator=g)
        io["input.decode_latents"] = latents
        mean = pipe.vae.bn.running_mean.view(1, -1, 1, 1)
        std = torch.sqrt(pipe.vae.bn.running_var.view(1, -1, 1, 1) + pipe.vae.config.batch_norm_eps)
        io["output.decoded"] = pipe.vae.decode(pipe._unpatchify_latents(latents * std + mean), return_dict=False)[0]

    x = torch.randn(b, channels, h // f, w // f, generator=g)
    io["input.initial_latents"] = x
    # Two reference pictures whose sides are not multiples of the token side (they are cropped).
    refs = [torch.randint(0, 256, (70, 101, 3), generator=g, dtype=torch.uint8),
            torch.randint(0, 256, (66, 64, 3), generator=g, dtype=torch.uint8)]
    pictures = [PIL.Image.fromarray(r.numpy()) for r in refs]
    for i, r in enumerate(refs):
        io[f"input.reference_{i}"] = r
    with torch.no_grad():
        sized = []
        for img in pictures:
            pipe.image_processor.check_image_input(img)
            cw, ch = (img.width // f) * f, (img.height // f) * f
            sized.append(pipe.image_processor.preprocess(img, height=ch, width=cw, resize_mode="crop"))
        tokens, ids = pipe.prepare_image_latents(images=sized, batch_size=1, generator=None, device="cpu",
                                                 dtype=torch.float32)
        io["output.reference_tokens"], io["output.reference_ids"] = tokens, ids
    runs = [("", pipe, None), ("distilled_", distilled(pipeline_dir), None), ("reference_", pipe, pictures)]
    for key, p, image in runs:
        final = {}

        def keep(pipe_, i, t, kwargs):
            final["latents"] = kwargs["latents"]
            return {}

        image = p(image=image, prompt=list(PROMPTS), height=h, width=w, num_inference_steps=s["steps"],
                  guidance_scale=s["guidance_scale"], latents=x.clone(), max_sequence_length=n_len, output_type="np",
                  callback_on_step_end=keep).images
        packed = final["latents"]
        io[f"output.{key}final_latents"] = packed.transpose(1, 2).reshape(x.shape)
        io[f"output.{key}images"] = torch.from_numpy(np.ascontiguousarray(image))
        io[f"output.{key}sigmas"] = p.scheduler.sigmas.clone()
    save_file({k: v.contiguous() for k, v in io.items()}, out)
    print(f"wrote {out}: {s}, sigmas {[round(float(v), 4) for v in io['output.sigmas']]}")


def distilled(pipeline_dir):
    """The same pipeline with `is_distilled: true` in its index (a copy in a temporary folder)."""
    from diffusers import Flux2KleinPipeline

    tmp = tempfile.mkdtemp()
    copy = os.path.join(tmp, "pipe")
    shutil.copytree(pipeline_dir, copy)
    index = os.path.join(copy, "model_index.json")
    config = json.load(open(index))
    config["is_distilled"] = True
    json.dump(config, open(index, "w"))
    return Flux2KleinPipeline.from_pretrained(copy)


def main(out_dir):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(20261125)
    entries = [transformer_case(spec, out_dir, g) for spec in CONFIGS]
    update_manifest(out_dir, entries, "flux2_transformer")
    for e in entries:
        print(e["name"], "lora params", e["lora_params"], "adapted", len(e["adapted_modules"]),
              "abs mean", e["output_abs_mean"])
    pipeline_case(os.path.join(out_dir, "flux2_klein_pipeline"),
                  os.path.join(out_dir, "flux2_klein_pipeline_io.safetensors"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fixtures")
