"""The activation constants of `flowtune plan` (docs/plan.md, "Activations"): bytes saved for backward
per token, per hidden unit and per block (c), for each diffusers 0.42.1 block class, in bf16 and f32.

Method (large-models.md §2.2): the real transformer class at a reduced width (4 heads of the real head
width, the real MLP ratio) with B and B + 1 blocks; every tensor autograd saves during one forward
(`torch.autograd.graph.saved_tensors_hooks`), parameters excluded, unique storages summed; c is the
difference over the tokens the block sees times its hidden width. Weights require gradients, as under
LoRA, where every adapted linear keeps its input.

On a GPU (`--device cuda`) the blocks run where training runs them: attention through the fused
SDPA kernels, which save their log-sum-exp rather than the attention matrix. `--json OUT` writes the
constants by block, as `flowtune plan --constants OUT` reads them.

Usage (torch and diffusers 0.42.1):
    python scripts/measure_activation_constants.py [--side 32 --text-len 64 --device cpu --json OUT]
"""
import argparse
import json
import os

import torch
from diffusers import (
    FluxTransformer2DModel,
    QwenImageTransformer2DModel,
    SD3Transformer2DModel,
    WanTransformer3DModel,
    ZImageTransformer2DModel,
)

MODELS = os.path.join(os.path.dirname(__file__), "..", "examples", "models")
HEADS = 4


def shipped(name):
    with open(os.path.join(MODELS, name, "transformer", "config.json")) as f:
        config = json.load(f)
    return {k: v for k, v in config.items() if not k.startswith("_")}


def saved_bytes(model, args, dtype):
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    dev = next(model.parameters()).device
    cast = lambda v: (v.to(dev, dtype) if v.is_floating_point() else v.to(dev)) if torch.is_tensor(v) else v
    args = {k: ([cast(x) for x in v] if isinstance(v, list) and v and torch.is_tensor(v[0]) else cast(v))
            for k, v in args.items()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(**args)
    return sum(seen.values())


def sd3(blocks, dual, a):
    c = shipped("sd3.5-medium")
    width = HEADS * c["attention_head_dim"]
    c.update(num_layers=blocks + 1, num_attention_heads=HEADS, caption_projection_dim=width,
             joint_attention_dim=256, pooled_projection_dim=64, pos_embed_max_size=64,
             dual_attention_layers=list(range(blocks + 1)) if dual else [])
    m = SD3Transformer2DModel(**c)
    args = dict(hidden_states=torch.randn(1, 16, a.side, a.side),
                encoder_hidden_states=torch.randn(1, a.text_len, 256),
                pooled_projections=torch.randn(1, 64), timestep=torch.full((1,), 500.0))
    return m, args, width, (a.side // 2) ** 2 + a.text_len


def flux(blocks, single, a):
    c = shipped("flux.1-dev")
    width = HEADS * c["attention_head_dim"]
    c.update(num_layers=blocks if not single else 1, num_single_layers=blocks if single else 1,
             num_attention_heads=HEADS, joint_attention_dim=256, pooled_projection_dim=64)
    m = FluxTransformer2DModel(**c)
    side = a.side // 2
    ids = torch.zeros(side, side, 3)
    ids[..., 1] += torch.arange(side)[:, None]
    ids[..., 2] += torch.arange(side)[None, :]
    args = dict(hidden_states=torch.randn(1, side * side, 64),
                encoder_hidden_states=torch.randn(1, a.text_len, 256),
                pooled_projections=torch.randn(1, 64), timestep=torch.full((1,), 0.5),
                img_ids=ids.reshape(-1, 3), txt_ids=torch.zeros(a.text_len, 3),
                guidance=torch.full((1,), 3.5))
    return m, args, width, side * side + a.text_len


def qwen(blocks, a):
    c = shipped("qwen-image")
    width = HEADS * c["attention_head_dim"]
    c.update(num_layers=blocks, num_attention_heads=HEADS, joint_attention_dim=256)
    m = QwenImageTransformer2DModel(**c)
    side = a.side // 2
    args = dict(hidden_states=torch.randn(1, side * side, 64),
                encoder_hidden_states=torch.randn(1, a.text_len, 256),
                encoder_hidden_states_mask=torch.ones(1, a.text_len, dtype=torch.int64),
                timestep=torch.full((1,), 0.5), img_shapes=[[(1, side, side)]])
    return m, args, width, side * side + a.text_len


def z_image(blocks, a):
    c = shipped("z-image-turbo")
    width = HEADS * (c["dim"] // c["n_heads"])
    c.update(n_layers=blocks, dim=width, n_heads=HEADS, n_kv_heads=HEADS, cap_feat_dim=256)
    m = ZImageTransformer2DModel(**c)
    args = dict(x=[torch.randn(16, 1, a.side, a.side)], t=torch.full((1,), 0.5),
                cap_feats=[torch.randn(a.text_len, 256)])
    # the caption is padded to a multiple of 32 in the joint sequence
    return m, args, width, (a.side // 2) ** 2 + -(-a.text_len // 32) * 32


def wan(blocks, name, a):
    c = shipped(name)
    width = HEADS * c["attention_head_dim"]
    ratio = c["ffn_dim"] / (c["num_attention_heads"] * c["attention_head_dim"])
    c.update(num_layers=blocks, num_attention_heads=HEADS, ffn_dim=int(round(ratio * width)), text_dim=256)
    m = WanTransformer3DModel(**c)
    args = dict(hidden_states=torch.randn(1, c["in_channels"], 1, a.side, a.side),
                timestep=torch.full((1,), 500.0), encoder_hidden_states=torch.randn(1, a.text_len, 256))
    return m, args, width, (a.side // 2) ** 2


def constant(build, dtype, device):
    """c of the block `build(b)` adds when going from b = 1 to 2 blocks (SD3: 2 to 3, its last
    block being the context-pre-only one)."""
    torch.manual_seed(0)
    sizes = []
    for blocks in (1, 2):
        model, args, width, tokens = build(blocks)
        model = model.to(device, dtype)
        sizes.append(saved_bytes(model, args, dtype))
    return (sizes[1] - sizes[0]) / (tokens * width)


# The planner's names of the blocks below (crates/plan/src/denoisers.rs), in order.
KEYS = ["sd3_dual", "sd3_plain", "flux_double", "flux_single", "qwen_image", "z_image", "wan_a14b", "wan_5b"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", type=int, default=32, help="latent side (image tokens: (side/2)²)")
    ap.add_argument("--text-len", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", help="also write the constants here, by block")
    a = ap.parse_args()
    torch.set_grad_enabled(True)
    rows = [
        ("SD3.5-M dual", lambda b: sd3(b, True, a)),
        ("SD3.5 plain", lambda b: sd3(b, False, a)),
        ("FLUX double", lambda b: flux(b, False, a)),
        ("FLUX single", lambda b: flux(b, True, a)),
        ("Qwen-Image", lambda b: qwen(b, a)),
        ("Z-Image", lambda b: z_image(b, a)),
        ("Wan-A14B", lambda b: wan(b, "wan2.2-t2v-a14b", a)),
        ("Wan-5B", lambda b: wan(b, "wan2.2-ti2v-5b", a)),
    ]
    print("| block | c bf16 | c f32 | f32 / bf16 |")
    print("|---|---|---|---|")
    found = {}
    for (name, build), key in zip(rows, KEYS):
        bf16, f32 = (constant(build, dt, a.device) for dt in (torch.bfloat16, torch.float32))
        found[key] = {"bf16": round(bf16, 2), "f32": round(f32, 2)}
        print(f"| {name} | {bf16:.1f} | {f32:.1f} | {f32 / bf16:.2f} |", flush=True)
    if a.json:
        device = torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu"
        with open(a.json, "w") as f:
            json.dump({"device": device, "side": a.side, "text_len": a.text_len, "constants": found}, f, indent=1)


if __name__ == "__main__":
    main()
