"""The PyTorch-eager anchor for `flowtune bench transformer`: the same shapes and weights in diffusers
(SD3Transformer2DModel, QwenImageTransformer2DModel, ZImageTransformer2DModel, FluxTransformer2DModel,
Flux2Transformer2DModel or WanTransformer3DModel; --latent is the unpacked latent side, --frames the latent frames of a video transformer). For Z-Image, give flowtune the same adapters: `flowtune bench transformer ... --lora-targets
to_q,to_k,to_v,to_out.0,feed_forward.w1,feed_forward.w2,feed_forward.w3`.

Usage (needs `pip install torch diffusers peft`):
    python scripts/bench_transformer_diffusers.py DIR [--batch 2 --latent 64 --frames 1 --text-len 77 --iters 5 --lora-rank 32]
"""
import argparse
import time

import torch
import json
import os

from diffusers import (
    Flux2Transformer2DModel,
    FluxTransformer2DModel,
    QwenImageTransformer2DModel,
    SD3Transformer2DModel,
    WanTransformer3DModel,
    ZImageTransformer2DModel,
)
from peft import LoraConfig

TARGETS = ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out"]
WAN_TARGETS = [f"attn{i}.{p}" for i in (1, 2) for p in ("to_q", "to_k", "to_v", "to_out.0")] + ["ffn.net.0.proj", "ffn.net.2"]
FLUX2_TARGETS = TARGETS + ["attn.to_qkv_mlp_proj", "ff.linear_in", "ff.linear_out", "ff_context.linear_in",
                           "ff_context.linear_out"]
Z_IMAGE_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3"]


def timed(iters, fn):
    fn()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--latent", type=int, default=64)
    ap.add_argument("--frames", type=int, default=1)
    ap.add_argument("--text-len", type=int, default=77)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--lora-rank", type=int, default=32)
    a = ap.parse_args()
    torch.manual_seed(0)
    cls = json.load(open(os.path.join(a.dir, "config.json")))["_class_name"]
    if cls == "QwenImageTransformer2DModel":
        model = QwenImageTransformer2DModel.from_pretrained(a.dir).eval()
        c = model.config
        side = a.latent // c.patch_size
        args = dict(
            hidden_states=torch.randn(a.batch, side * side, c.in_channels),
            encoder_hidden_states=torch.randn(a.batch, a.text_len, c.joint_attention_dim),
            encoder_hidden_states_mask=torch.ones(a.batch, a.text_len, dtype=torch.int64),
            timestep=torch.full((a.batch,), 0.5),
            img_shapes=[[(1, side, side)]] * a.batch,
            return_dict=False,
        )
    elif cls == "WanTransformer3DModel":
        model = WanTransformer3DModel.from_pretrained(a.dir).eval()
        c = model.config
        args = dict(
            hidden_states=torch.randn(a.batch, c.in_channels, a.frames, a.latent, a.latent),
            timestep=torch.full((a.batch,), 500.0),
            encoder_hidden_states=torch.randn(a.batch, a.text_len, c.text_dim),
            return_dict=False,
        )
    elif cls == "ZImageTransformer2DModel":
        model = ZImageTransformer2DModel.from_pretrained(a.dir).eval()
        c = model.config
        # the pipeline's call: one frame per row, each row's caption states, t = (1000 - timestep) / 1000
        latents = list(torch.randn(a.batch, c.in_channels, 1, a.latent, a.latent).unbind(0))
        captions = list(torch.randn(a.batch, a.text_len, c.cap_feat_dim).unbind(0))
        args = dict(x=latents, t=torch.full((a.batch,), 0.5), cap_feats=captions, return_dict=False)
    elif cls == "FluxTransformer2DModel":
        model = FluxTransformer2DModel.from_pretrained(a.dir).eval()
        c = model.config
        side = a.latent // 2  # the pipeline packs 2 x 2 (the transformer's own patch_size is 1)
        ids = torch.zeros(side, side, 3)
        ids[..., 1] += torch.arange(side)[:, None]
        ids[..., 2] += torch.arange(side)[None, :]
        args = dict(
            hidden_states=torch.randn(a.batch, side * side, c.in_channels),
            encoder_hidden_states=torch.randn(a.batch, a.text_len, c.joint_attention_dim),
            pooled_projections=torch.randn(a.batch, c.pooled_projection_dim),
            timestep=torch.full((a.batch,), 0.5),
            img_ids=ids.reshape(-1, 3),
            txt_ids=torch.zeros(a.text_len, 3),
            guidance=torch.full((a.batch,), 3.5) if c.guidance_embeds else None,
            return_dict=False,
        )
    elif cls == "Flux2Transformer2DModel":
        model = Flux2Transformer2DModel.from_pretrained(a.dir).eval()
        c = model.config
        side = a.latent // 2  # one token per 2 x 2 patch of the VAE latent
        args = dict(
            hidden_states=torch.randn(a.batch, side * side, c.in_channels),
            encoder_hidden_states=torch.randn(a.batch, a.text_len, c.joint_attention_dim),
            timestep=torch.full((a.batch,), 0.5),
            img_ids=torch.cartesian_prod(torch.arange(1), torch.arange(side), torch.arange(side), torch.arange(1)),
            txt_ids=torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(a.text_len)),
            guidance=torch.full((a.batch,), 4.0) if c.guidance_embeds else None,
            return_dict=False,
        )
    else:
        model = SD3Transformer2DModel.from_pretrained(a.dir).eval()
        c = model.config
        args = dict(
            hidden_states=torch.randn(a.batch, c.in_channels, a.latent, a.latent),
            encoder_hidden_states=torch.randn(a.batch, a.text_len, c.joint_attention_dim),
            pooled_projections=torch.randn(a.batch, c.pooled_projection_dim),
            timestep=torch.full((a.batch,), 500.0),
            return_dict=False,
        )
    with torch.no_grad():
        fwd = timed(a.iters, lambda: model(**args))
    targets = {"ZImageTransformer2DModel": Z_IMAGE_TARGETS, "WanTransformer3DModel": WAN_TARGETS,
               "Flux2Transformer2DModel": FLUX2_TARGETS}.get(cls, TARGETS)
    model.add_adapter(LoraConfig(r=a.lora_rank, lora_alpha=2 * a.lora_rank, target_modules=targets, init_lora_weights="gaussian"))
    for n, p in model.named_parameters():
        p.requires_grad_("lora_" in n)

    def step():
        out = model(**args)[0]
        (torch.stack(out) if isinstance(out, list) else out).square().mean().backward()

    bwd = timed(a.iters, step)
    if cls == "WanTransformer3DModel":
        pt, ph, pw = c.patch_size
        tokens = a.batch * (a.frames // pt) * (a.latent // ph) * (a.latent // pw)
    else:
        patch = 2 if cls in ("FluxTransformer2DModel", "Flux2Transformer2DModel") else getattr(c, "patch_size", 2)
        tokens = a.batch * (a.latent // patch) ** 2
    print(f"diffusers threads {torch.get_num_threads()}")
    print(f"forward:               {fwd * 1e3:8.1f} ms  {tokens / fwd:10.0f} image tokens/s")
    print(f"forward+backward LoRA: {bwd * 1e3:8.1f} ms  {tokens / bwd:10.0f} image tokens/s")


if __name__ == "__main__":
    main()
