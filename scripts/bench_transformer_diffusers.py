"""The PyTorch-eager anchor for `flowtune bench transformer`: the same shapes and weights in diffusers
(SD3Transformer2DModel, QwenImageTransformer2DModel, ZImageTransformer2DModel, FluxTransformer2DModel,
Flux2Transformer2DModel or WanTransformer3DModel; --latent is the unpacked latent side, --frames the latent frames of a video transformer). For Z-Image, give flowtune the same adapters: `flowtune bench transformer ... --lora-targets
to_q,to_k,to_v,to_out.0,feed_forward.w1,feed_forward.w2,feed_forward.w3`.

Usage (needs `pip install torch diffusers peft`):
    python scripts/bench_transformer_diffusers.py DIR [--batch 2 --latent 64 --frames 1 --text-len 77 --iters 5 --lora-rank 32
        --device cpu --dtype f32 --json OUT.json]
    python scripts/bench_transformer_diffusers.py --random-weights examples/models/qwen-image/transformer --device cuda \
        --dtype bf16 --batch 8 --latent 64 --text-tokens 32 --lora-rank 64 --iters 2 [--layers N] --json OUT.json

DIR (or a pipeline folder: its transformer/) holds the weights; --random-weights DIR needs only its config.json: the
model is built on --device in --dtype with seeded random weights (as in bench_rollout_diffusers.py), --layers N keeps
its first N blocks. Timed (synchronised, median of --iters after one warm-up): `forward_seconds`, a no-grad forward
with the LoRA attached; `seconds_per_step`, forward + backward of a mean-square loss into the LoRA (PEFT, added by
`add_adapter` as diffusers' training scripts do; gradient checkpointing on by default with --random-weights);
tokens_per_s counts image tokens. Defaults: LoRA rank 64 with --random-weights, else 32; alpha 2 x rank; the
family's targets (Qwen-Image's are the recipe's: attention of both streams and both feed-forwards).
"""
import argparse
import json
import os
import statistics
import time

import torch
import diffusers
import peft
from peft import LoraConfig

from bench_rollout_diffusers import DTYPES, build_random, parse_dtype, read_json, with_layers

QWEN_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
                "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2"]
TARGETS = ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out"]
WAN_TARGETS = [f"attn{i}.{p}" for i in (1, 2) for p in ("to_q", "to_k", "to_v", "to_out.0")] + ["ffn.net.0.proj", "ffn.net.2"]
FLUX2_TARGETS = TARGETS + ["attn.to_qkv_mlp_proj", "ff.linear_in", "ff.linear_out", "ff_context.linear_in",
                           "ff_context.linear_out"]
Z_IMAGE_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3"]


def timed(iters, fn, sync):
    """The median seconds of `iters` synchronised calls of `fn` after one warm-up call."""
    fn()
    times = []
    for _ in range(iters):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", nargs="?", help="a transformer folder with weights (or a pipeline folder)")
    ap.add_argument("--random-weights", metavar="DIR", help="a transformer (or pipeline) folder: config only, "
                    "random weights")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", type=parse_dtype, default="f32", help="f32 | bf16 | f16")
    ap.add_argument("--layers", type=int, help="keep the first N blocks (--random-weights)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--latent", type=int, default=64)
    ap.add_argument("--frames", type=int, default=1)
    ap.add_argument("--text-len", "--text-tokens", dest="text_len", type=int, default=77)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--lora-rank", type=int, help="64 with --random-weights, else 32")
    ap.add_argument("--lora-alpha", type=float, help="2 x rank")
    ap.add_argument("--lora-targets", help="comma-separated (the family's own list when absent)")
    ap.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction,
                    help="on by default with --random-weights")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the result as one JSON object here")
    a = ap.parse_args()
    path = a.random_weights or a.dir
    if path is None:
        ap.error("give DIR or --random-weights DIR")
    if a.layers is not None and not a.random_weights:
        ap.error("--layers needs --random-weights")
    if os.path.exists(os.path.join(path, "model_index.json")):
        path = os.path.join(path, "transformer")
    rank = a.lora_rank or (64 if a.random_weights else 32)
    checkpointing = a.gradient_checkpointing if a.gradient_checkpointing is not None else bool(a.random_weights)
    device, dtype = torch.device(a.device), DTYPES[a.dtype]
    cuda = device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    config = read_json(os.path.join(path, "config.json"))
    cls = config["_class_name"]
    start = time.perf_counter()
    if a.random_weights:
        model = build_random(getattr(diffusers, cls), with_layers(config, a.layers), device, dtype, a.seed)
    else:
        model = getattr(diffusers, cls).from_pretrained(path, torch_dtype=dtype).to(device).eval()
    sync()
    build_seconds = time.perf_counter() - start
    torch.manual_seed(a.seed)
    c = model.config
    if cls == "QwenImageTransformer2DModel":
        side = a.latent // c.patch_size
        args = dict(
            hidden_states=torch.randn(a.batch, side * side, c.in_channels),
            encoder_hidden_states=torch.randn(a.batch, a.text_len, c.joint_attention_dim),
            encoder_hidden_states_mask=None,  # every token valid: QwenImagePipeline passes no mask then
            timestep=torch.full((a.batch,), 0.5),
            img_shapes=[[(1, side, side)]] * a.batch,
            return_dict=False,
        )
    elif cls == "WanTransformer3DModel":
        args = dict(
            hidden_states=torch.randn(a.batch, c.in_channels, a.frames, a.latent, a.latent),
            timestep=torch.full((a.batch,), 500.0),
            encoder_hidden_states=torch.randn(a.batch, a.text_len, c.text_dim),
            return_dict=False,
        )
    elif cls == "ZImageTransformer2DModel":
        # the pipeline's call: one frame per row, each row's caption states, t = (1000 - timestep) / 1000
        latents = list(torch.randn(a.batch, c.in_channels, 1, a.latent, a.latent).unbind(0))
        captions = list(torch.randn(a.batch, a.text_len, c.cap_feat_dim).unbind(0))
        args = dict(x=latents, t=torch.full((a.batch,), 0.5), cap_feats=captions, return_dict=False)
    elif cls == "FluxTransformer2DModel":
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
        args = dict(
            hidden_states=torch.randn(a.batch, c.in_channels, a.latent, a.latent),
            encoder_hidden_states=torch.randn(a.batch, a.text_len, c.joint_attention_dim),
            pooled_projections=torch.randn(a.batch, c.pooled_projection_dim),
            timestep=torch.full((a.batch,), 500.0),
            return_dict=False,
        )
    data = ("hidden_states", "encoder_hidden_states", "pooled_projections", "timestep", "x", "t", "cap_feats")

    def to_device(key, v):
        if isinstance(v, list) and v and isinstance(v[0], torch.Tensor):
            return [to_device(key, x) for x in v]
        if not isinstance(v, torch.Tensor):
            return v
        return v.to(device, dtype) if key in data else v.to(device)

    args = {k: to_device(k, v) for k, v in args.items()}
    targets = a.lora_targets.split(",") if a.lora_targets else {
        "QwenImageTransformer2DModel": QWEN_TARGETS, "ZImageTransformer2DModel": Z_IMAGE_TARGETS,
        "WanTransformer3DModel": WAN_TARGETS, "Flux2Transformer2DModel": FLUX2_TARGETS}.get(cls, TARGETS)
    alpha = a.lora_alpha if a.lora_alpha is not None else 2.0 * rank
    model.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, init_lora_weights="gaussian"))
    lora = 0
    for n, p in model.named_parameters():
        p.requires_grad_("lora_" in n)
        lora += p.numel() if "lora_" in n else 0
    with torch.no_grad():
        fwd = timed(a.iters, lambda: model(**args), sync)
    if checkpointing:
        model.enable_gradient_checkpointing()
    model.train()

    def step():
        model.zero_grad(set_to_none=True)
        out = model(**args)[0]
        (torch.stack(out) if isinstance(out, list) else out).float().square().mean().backward()

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    bwd = timed(a.iters, step, sync)
    if cls == "WanTransformer3DModel":
        pt, ph, pw = c.patch_size
        tokens = a.batch * (a.frames // pt) * (a.latent // ph) * (a.latent // pw)
    else:
        patch = 2 if cls in ("FluxTransformer2DModel", "Flux2Transformer2DModel") else getattr(c, "patch_size", 2)
        tokens = a.batch * (a.latent // patch) ** 2
    print(f"diffusers {cls} on {a.device} ({a.dtype}), threads {torch.get_num_threads()}, LoRA r{rank} "
          f"({lora:,} params), gradient checkpointing {'on' if checkpointing else 'off'}")
    print(f"forward:               {fwd * 1e3:8.1f} ms  {tokens / fwd:10.0f} image tokens/s")
    print(f"forward+backward LoRA: {bwd * 1e3:8.1f} ms  {tokens / bwd:10.0f} image tokens/s")
    result = {
        "anchor": "diffusers_lora_train",
        "class": cls,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "dtype": a.dtype,
        "batch": a.batch,
        "latent": a.latent,
        "frames": a.frames,
        "text_tokens": a.text_len,
        "layers": a.layers,
        "iters": a.iters,
        "lora_rank": rank,
        "lora_alpha": alpha,
        "lora_targets": targets,
        "lora_params": lora,
        "gradient_checkpointing": checkpointing,
        "seconds_per_step": bwd,
        "forward_seconds": fwd,
        "tokens": tokens,
        "tokens_per_s": tokens / bwd,
        "forward_tokens_per_s": tokens / fwd,
        "build_seconds": build_seconds,
        "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
        "diffusers_version": diffusers.__version__,
        "peft_version": peft.__version__,
        "torch_version": torch.__version__,
    }
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
