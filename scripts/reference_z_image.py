"""Reference fixtures for the Z-Image transformer (diffusers' ZImageTransformer2DModel).

Usage (the project's reference venv: torch, diffusers, peft):
    python scripts/reference_z_image.py fixtures

Writes, for each tiny random config below, `<name>/` (config.json + safetensors), `<name>_lora.safetensors`
(a random LoRA in the diffusers layout) and `<name>_io.safetensors` (`input.x` (B, C, 1, H, W) stacked from the
list diffusers' forward takes, `input.t` as the pipeline passes it, `input.cap_feats` (B, L, D) with `input.cap_mask`
(B, L) selecting each row's caption tokens; `output.sample`, `output.sample_with_lora`, `loss_weight`,
`grad.transformer.*` of mean(sample_with_lora · loss_weight)), and updates the entries of kind
`z_image_transformer` in `manifest.json`.
"""
import os
import sys

import torch

from transformer_fixtures import lora_case, randomize_, update_manifest

REFERENCE_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3"]

CONFIGS = [
    {
        "name": "z_image_tiny",
        "config": dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=64, n_layers=2,
                       n_refiner_layers=1, n_heads=2, n_kv_heads=2, cap_feat_dim=24, axes_dims=[8, 12, 12],
                       axes_lens=[256, 32, 32]),
        # 6 × 10 latent cells → 15 image tokens (padded to 32); captions of 7 and 40 valid tokens (32 and 64
        # after padding): the unified stream is masked.
        "latent": (6, 10),
        "text_len": 40,
        "valid": [7, 40],
        "t": [0.05, 0.6875],
        "lora": {"r": 4, "alpha": 8, "targets": REFERENCE_TARGETS},
    },
    {
        "name": "z_image_wide",
        "config": dict(all_patch_size=(2, 4), all_f_patch_size=(1, 1), in_channels=4, dim=96, n_layers=1,
                       n_refiner_layers=2, n_heads=3, n_kv_heads=3, qk_norm=False, cap_feat_dim=20,
                       rope_theta=100.0, t_scale=500.0, axes_dims=[8, 8, 16], axes_lens=[128, 16, 16]),
        # 8 × 8 latent → 16 tokens; both captions 5 tokens: no mask.
        "latent": (8, 8),
        "text_len": 5,
        "valid": [5, 5],
        "t": [0.9, 0.25],
        "lora": {"r": 3, "alpha": 6, "targets": "all-linear"},
    },
]


def transformer_case(spec, out_dir, g):
    from diffusers import ZImageTransformer2DModel

    name = spec["name"]
    model = ZImageTransformer2DModel(**spec["config"]).eval()
    randomize_(model, g)
    model.save_pretrained(os.path.join(out_dir, name), safe_serialization=True)
    c = model.config
    b = len(spec["t"])
    h, w = spec["latent"]
    x = torch.randn(b, c.in_channels, 1, h, w, generator=g)
    cap = torch.randn(b, spec["text_len"], c.cap_feat_dim, generator=g)
    mask = torch.zeros(b, spec["text_len"], dtype=torch.int64)
    for row, n in enumerate(spec["valid"]):
        mask[row, :n] = 1
    t = torch.tensor(spec["t"], dtype=torch.float32)
    inp = {"x": x, "t": t, "cap_feats": cap, "cap_mask": mask}

    def run():
        out = model(list(x.unbind(0)), t, [cap[i][mask[i].bool()] for i in range(b)], return_dict=False)[0]
        return torch.stack(out, 0)

    with torch.no_grad():
        out = run()
    io = {f"input.{k}": v for k, v in inp.items()}
    io["output.sample"] = out

    return lora_case(model, run, name, "z_image_transformer", spec["lora"], io, out_dir, g)


def main(out_dir):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(20261123)
    entries = [transformer_case(spec, out_dir, g) for spec in CONFIGS]
    update_manifest(out_dir, entries, "z_image_transformer")
    for e in entries:
        print(e["name"], "lora params", e["lora_params"], "adapted", len(e["adapted_modules"]),
              "output |mean|", e["output_abs_mean"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fixtures")
