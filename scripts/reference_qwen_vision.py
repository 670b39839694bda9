"""Qwen2.5-VL vision-tower and image-processor fixtures (Qwen-Image-Edit-Plus's condition images).

    /root/.cache/flowtune/venv/bin/python scripts/reference_qwen_vision.py

Needs torch, transformers (5.x), Pillow and safetensors; no GPU, no network. Deterministic (fixed
seeds). transformers falls back to `Qwen2VLImageProcessorPil` when torchvision is missing (as in
the project venv): its resize is PIL's 8-bit bicubic. Writes into `fixtures/`:

- `qwen_vision_window/`: a tiny random `Qwen2_5_VLForConditionalGeneration` in the flat
  `config.json` and `visual.*` key layout of `Qwen/Qwen-Image`'s text encoder, with a vision tower
  of 3 blocks (`fullatt_block_indexes` [1], the others windowed), patch 4 and a window of 2×2
  merged tokens, so that the grids below are cut into several (padded) windows.
- `qwen_vision_nested/`: transformers 5's nested `text_config` and `model.visual.*` keys, patch 14,
  the default window (112 px, larger than the grids), `fullatt_block_indexes` [0] of 2 blocks.
- `qwen_vision_processor/preprocessor_config.json`: a Qwen2-VL processor config with small
  `min_pixels` / `max_pixels` (both spellings: top level and `size`).
- `qwen_vision_io.safetensors`:
  - `processor.<case>.image` (H, W, 3) u8, `.pixel_values` (N, 1176) f32, `.grid_thw` (1, 3) i64:
    `up` (20×30, default config: the min_pixels branch), `tie` (42×70, default: round-half-even in
    smart_resize), `wide` (50×80, default), `down` (90×130, the config above: max_pixels branch).
  - `<model>.grid_thw`, `<model>.output` = `model.model.visual(pixel_values, grid_thw=...)
    .pooler_output` (the merged embeddings, (N / 4, out_hidden_size)); `window.pixel_values` are
    random patches over grids (1,10,6), (2,4,4), (1,6,8); `nested` takes the `wide` and `down`
    processor outputs, concatenated.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures"

TEXT = dict(vocab_size=64, hidden_size=24, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-6,
            rope_parameters=dict(rope_type="default", rope_theta=1e6, mrope_section=[2, 2, 2]))
MODELS = {
    "window": dict(depth=3, hidden_size=32, intermediate_size=40, num_heads=2,
                   fullatt_block_indexes=[1], patch_size=4, in_channels=3, spatial_merge_size=2,
                   temporal_patch_size=2, window_size=16, out_hidden_size=24, seed=21),
    "nested": dict(depth=2, hidden_size=16, intermediate_size=24, num_heads=2,
                   fullatt_block_indexes=[0], patch_size=14, in_channels=3, spatial_merge_size=2,
                   temporal_patch_size=2, window_size=112, out_hidden_size=24, seed=22),
}
PROCESSOR = dict(min_pixels=28 * 28 * 2, max_pixels=28 * 28 * 6)
PICTURES = {"up": (20, 30, False), "tie": (42, 70, False), "wide": (50, 80, False),
            "down": (90, 130, True)}


def build(name: str, spec: dict):
    spec = dict(spec)
    torch.manual_seed(spec.pop("seed"))
    cfg = Qwen2_5_VLConfig(text_config=TEXT, vision_config=spec)
    model = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname or "ln_q" in pname:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    out = FIX / f"qwen_vision_{name}"
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out)
    (out / "generation_config.json").unlink(missing_ok=True)
    config = json.loads((out / "config.json").read_text())
    if name == "window":
        # transformers 4.5x's flat layout (Qwen/Qwen-Image): text fields at the top level, and the
        # vision tower's `in_chans` spelling.
        text_cfg = config.pop("text_config")
        rope = text_cfg.pop("rope_parameters")
        for k in ["model_type", "layer_types", "pad_token_id", "dtype"]:
            text_cfg.pop(k, None)
        config.update(text_cfg)
        config["rope_theta"] = rope["rope_theta"]
        config["rope_scaling"] = {"mrope_section": rope["mrope_section"], "rope_type": "default",
                                  "type": "default"}
        vision = config["vision_config"]
        vision.pop("rope_parameters", None)
        vision["in_chans"] = vision.pop("in_channels")
        vision["model_type"] = "qwen2_5_vl"
        config["transformers_version"] = "4.53.1"
        config = dict(sorted(config.items()))
    else:
        file = out / "model.safetensors"
        renamed = {}
        for k, v in load_file(file).items():
            if k.startswith("model."):
                k = "model.language_model." + k[len("model."):]
            elif k.startswith("visual."):
                k = "model." + k
            renamed[k] = v
        save_file(renamed, file, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    loaded, info = Qwen2_5_VLForConditionalGeneration.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], (name, info)
    for k in ["depth", "window_size", "patch_size", "in_channels"]:
        assert getattr(loaded.config.vision_config, k) == spec[k], (name, k)
    return loaded.eval()


def processor_cases(tensors: dict) -> dict:
    cfg_dir = FIX / "qwen_vision_processor"
    cfg_dir.mkdir(parents=True, exist_ok=True)
    custom = Qwen2VLImageProcessorPil(**PROCESSOR)
    config = custom.to_dict()
    config["min_pixels"], config["max_pixels"] = PROCESSOR["min_pixels"], PROCESSOR["max_pixels"]
    config["image_processor_type"] = "Qwen2VLImageProcessor"
    config = {k: v for k, v in sorted(config.items()) if not k.startswith("_")}
    (cfg_dir / "preprocessor_config.json").write_text(json.dumps(config, indent=2) + "\n")
    custom = Qwen2VLImageProcessorPil.from_pretrained(cfg_dir)
    assert custom.size["longest_edge"] == PROCESSOR["max_pixels"], custom.size
    default = Qwen2VLImageProcessorPil()
    rng = np.random.default_rng(5)
    outs = {}
    for case, (h, w, use_custom) in PICTURES.items():
        image = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        proc = custom if use_custom else default
        out = proc(images=[Image.fromarray(image)], return_tensors="pt")
        tensors[f"processor.{case}.image"] = torch.from_numpy(image)
        tensors[f"processor.{case}.pixel_values"] = out["pixel_values"].float()
        tensors[f"processor.{case}.grid_thw"] = out["image_grid_thw"].long()
        outs[case] = out
        print(f"processor {case}: {h}x{w} -> grid {out['image_grid_thw'].tolist()}")
    return outs


def main():
    tensors = {}
    outs = processor_cases(tensors)
    for name, spec in MODELS.items():
        model = build(name, spec)
        if name == "window":
            grid = torch.tensor([[1, 10, 6], [2, 4, 4], [1, 6, 8]])
            dim = spec["in_channels"] * spec["temporal_patch_size"] * spec["patch_size"] ** 2
            gen = torch.Generator().manual_seed(3)
            pixels = torch.randn(int(grid.prod(-1).sum()), dim, generator=gen)
        else:
            pixels = torch.cat([outs[c]["pixel_values"] for c in ["wide", "down"]])
            grid = torch.cat([outs[c]["image_grid_thw"] for c in ["wide", "down"]])
        with torch.no_grad():
            out = model.model.visual(pixels, grid_thw=grid).pooler_output
        if name == "window":  # `nested` reads `processor.{wide,down}.pixel_values`
            tensors[f"{name}.pixel_values"] = pixels
        tensors[f"{name}.grid_thw"] = grid.long()
        tensors[f"{name}.output"] = out
        print(f"{name}: {tuple(pixels.shape)} grid {grid.tolist()} -> {tuple(out.shape)}")
    save_file({k: v.contiguous() for k, v in tensors.items()}, FIX / "qwen_vision_io.safetensors")


if __name__ == "__main__":
    main()
