"""Reference fixtures for the Qwen-Image transformer (diffusers' QwenImageTransformer2DModel).

Usage (the project's reference venv: torch, diffusers, peft):
    python scripts/reference_qwen_image.py fixtures

Writes, for each tiny random config below, `<name>/` (config.json + safetensors), `<name>_lora.safetensors`
(a random LoRA in the diffusers layout) and `<name>_io.safetensors` (`input.*` as diffusers' forward takes
them, with `input.img_shapes` as an (n, 3) int64 tensor; `output.sample`, `output.sample_with_lora`,
`loss_weight`, `grad.transformer.*` of mean(sample_with_lora · loss_weight)), and updates the entries of
kind `qwen_image_transformer` in `manifest.json`.
"""
import os
import sys

import torch

from transformer_fixtures import lora_case, randomize_, update_manifest

REFERENCE_TARGETS = [
    "to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
    "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2",
]

CONFIGS = [
    {
        "name": "qwen_image_tiny",
        "config": dict(num_layers=2, num_attention_heads=2, attention_head_dim=16, axes_dims_rope=(4, 6, 6),
                       joint_attention_dim=24, in_channels=64, out_channels=16),
        # Non-square: 6 × 10 latent cells → 3 × 5 tokens; an odd text length, the second row padded.
        "img_shapes": [(1, 3, 5)],
        "text_len": 7,
        "valid": [7, 4],
        "timesteps": [0.999, 0.3125],
        "lora": {"r": 4, "alpha": 8, "targets": REFERENCE_TARGETS},
    },
    {
        "name": "qwen_image_edit_tiny",
        "config": dict(num_layers=2, num_attention_heads=3, attention_head_dim=12, axes_dims_rope=(4, 4, 4),
                       joint_attention_dim=20, in_channels=64, out_channels=16, zero_cond_t=True),
        # The target (2 × 4 tokens) and one condition image (3 × 3 tokens); no text mask.
        "img_shapes": [(1, 2, 4), (1, 3, 3)],
        "text_len": 5,
        "valid": None,
        "timesteps": [0.75, 0.05],
        "lora": {"r": 3, "alpha": 6, "targets": "all-linear"},
    },
]


def transformer_case(spec, out_dir, g):
    from diffusers import QwenImageTransformer2DModel

    name = spec["name"]
    model = QwenImageTransformer2DModel(**spec["config"]).eval()
    randomize_(model, g)
    model.save_pretrained(os.path.join(out_dir, name), safe_serialization=True)
    c = model.config
    b = len(spec["timesteps"])
    tokens = sum(f * h * w for f, h, w in spec["img_shapes"])
    inp = {
        "hidden_states": torch.randn(b, tokens, c.in_channels, generator=g),
        "encoder_hidden_states": torch.randn(b, spec["text_len"], c.joint_attention_dim, generator=g),
        "timestep": torch.tensor(spec["timesteps"], dtype=torch.float32),
    }
    if spec["valid"] is not None:
        mask = torch.zeros(b, spec["text_len"], dtype=torch.int64)
        for row, n in enumerate(spec["valid"]):
            mask[row, :n] = 1
        inp["encoder_hidden_states_mask"] = mask
    call = dict(inp, img_shapes=[spec["img_shapes"]] * b, return_dict=False)
    with torch.no_grad():
        out = model(**call)[0]
    io = {f"input.{k}": v for k, v in inp.items()}
    io["input.img_shapes"] = torch.tensor(spec["img_shapes"], dtype=torch.int64)
    io["output.sample"] = out

    return lora_case(model, lambda: model(**call)[0], name, "qwen_image_transformer", spec["lora"], io, out_dir, g)


def guidance_embeds_fails():
    """diffusers 0.42 builds no guidance embedder: a guidance-distilled config cannot run."""
    from diffusers import QwenImageTransformer2DModel

    model = QwenImageTransformer2DModel(num_layers=1, num_attention_heads=1, attention_head_dim=16,
                                        axes_dims_rope=(4, 6, 6), joint_attention_dim=8, guidance_embeds=True)
    try:
        model(hidden_states=torch.randn(1, 4, 64), encoder_hidden_states=torch.randn(1, 3, 8),
              timestep=torch.tensor([0.5]), guidance=torch.tensor([4.0]), img_shapes=[[(1, 2, 2)]])
    except TypeError as e:
        return str(e)
    raise SystemExit("guidance_embeds=True ran in this diffusers: add it to the fixtures")


def main(out_dir):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(20261123)
    entries = [transformer_case(spec, out_dir, g) for spec in CONFIGS]
    print("guidance_embeds=True in diffusers:", guidance_embeds_fails())
    update_manifest(out_dir, entries, "qwen_image_transformer")
    for e in entries:
        print(e["name"], "lora params", e["lora_params"], "adapted", len(e["adapted_modules"]))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fixtures")
