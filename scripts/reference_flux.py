"""Reference fixtures for the FLUX.1 transformer (diffusers' FluxTransformer2DModel).

Usage (the project's reference venv: torch, diffusers, peft):
    python scripts/reference_flux.py fixtures

Writes, for each tiny random config below ([dev] with the guidance embedding, [schnell] without),
`<name>/` (config.json + safetensors), `<name>_lora.safetensors` (a random LoRA in the diffusers
layout) and `<name>_io.safetensors` (`input.*` as diffusers' forward takes them: packed
`hidden_states`, `timestep` as sigma, `img_ids` / `txt_ids` (S, 3) / (L, 3), `guidance` for [dev];
`output.sample`, `output.sample_with_lora`, `loss_weight`, `grad.transformer.*` of
mean(sample_with_lora * loss_weight)), and updates the entries of kind `flux_transformer` in
`manifest.json`.
"""
import os
import sys

import torch

from transformer_fixtures import lora_case, randomize_, update_manifest

REFERENCE_TARGETS = [
    "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
    "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
    "proj_mlp", "proj_out",
]

CONFIGS = [
    {
        "name": "flux_dev_tiny",
        "config": dict(num_layers=2, num_single_layers=2, num_attention_heads=2, attention_head_dim=16,
                       axes_dims_rope=(4, 6, 6), joint_attention_dim=24, pooled_projection_dim=12,
                       in_channels=64, guidance_embeds=True),
        # Non-square: a 6 x 10 latent -> 3 x 5 packed tokens; odd text length.
        "grid": (3, 5),
        "text_len": 7,
        "timesteps": [0.999, 0.3125],
        "guidance": [3.5, 1.0],
        "lora": {"r": 4, "alpha": 8, "targets": REFERENCE_TARGETS},
    },
    {
        "name": "flux_schnell_tiny",
        "config": dict(num_layers=1, num_single_layers=2, num_attention_heads=3, attention_head_dim=12,
                       axes_dims_rope=(4, 4, 4), joint_attention_dim=20, pooled_projection_dim=8,
                       in_channels=64, guidance_embeds=False),
        "grid": (4, 2),
        "text_len": 5,
        "timesteps": [0.75, 0.05],
        "guidance": None,
        "lora": {"r": 3, "alpha": 6, "targets": "all-linear"},
    },
]


def image_ids(rows, cols):
    ids = torch.zeros(rows, cols, 3)
    ids[..., 1] += torch.arange(rows)[:, None]
    ids[..., 2] += torch.arange(cols)[None, :]
    return ids.reshape(rows * cols, 3)


def transformer_case(spec, out_dir, g):
    from diffusers import FluxTransformer2DModel

    name = spec["name"]
    model = FluxTransformer2DModel(**spec["config"]).eval()
    randomize_(model, g)
    model.save_pretrained(os.path.join(out_dir, name), safe_serialization=True)
    c = model.config
    b = len(spec["timesteps"])
    rows, cols = spec["grid"]
    inp = {
        "hidden_states": torch.randn(b, rows * cols, c.in_channels, generator=g),
        "encoder_hidden_states": torch.randn(b, spec["text_len"], c.joint_attention_dim, generator=g),
        "pooled_projections": torch.randn(b, c.pooled_projection_dim, generator=g),
        "timestep": torch.tensor(spec["timesteps"], dtype=torch.float32),
        "img_ids": image_ids(rows, cols),
        "txt_ids": torch.zeros(spec["text_len"], 3),
    }
    if spec["guidance"] is not None:
        inp["guidance"] = torch.tensor(spec["guidance"], dtype=torch.float32)
    call = dict(inp, return_dict=False)
    with torch.no_grad():
        out = model(**call)[0]
    io = {f"input.{k}": v for k, v in inp.items()}
    io["output.sample"] = out

    return lora_case(model, lambda: model(**call)[0], name, "flux_transformer", spec["lora"], io, out_dir, g)


def main(out_dir):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(20261124)
    entries = [transformer_case(spec, out_dir, g) for spec in CONFIGS]
    update_manifest(out_dir, entries, "flux_transformer")
    for e in entries:
        print(e["name"], "lora params", e["lora_params"], "adapted", len(e["adapted_modules"]),
              "abs mean", e["output_abs_mean"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fixtures")
