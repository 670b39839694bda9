"""The PyTorch-eager anchor for `flowtune bench rollout` and the GPU suite: the same pipeline, batch, steps and CFG
in diffusers' pipeline of the directory (ODE sampling and VAE decode; Qwen-Image's CFG is its "true CFG" against a
negative prompt; Wan samples --num-frames frames; flowtune's rollout also computes SDE log-probs).

Usage (needs torch and diffusers; transformers too without --random-weights):
    python scripts/bench_rollout_diffusers.py DIR [--batch 4 --steps 10 --guidance 4.5 --resolution 512 --iters 3
        --num-frames 81 --device cpu --dtype f32 --json OUT.json]
    python scripts/bench_rollout_diffusers.py examples/models/qwen-image --random-weights --device cuda --dtype bf16 \
        --batch 32 --steps 10 --guidance 4.0 --resolution 512 --text-tokens 32 --iters 1 [--layers N] --json OUT.json

Without --random-weights DIR is a complete pipeline (weights, tokenizer, text encoder: the prompt is encoded inside
each call). With it DIR needs only model_index.json, the components' config.json and the scheduler's config
(Qwen-Image falls back to examples/schedulers/qwen_image.json): the transformer(s) and the VAE are built from their
configs on --device in --dtype and filled with seeded random values there (matrices and convolutions N(0, 1/fan_in),
other 1-D weights 1, biases 0, any other parameter N(0, 0.02^2)); no text encoder is built: each call gets seeded
random prompt embeddings of --text-tokens tokens (all unmasked) and the same for the negative prompt.
QwenImagePipeline, WanPipeline and Flux2KleinPipeline take embeddings this way; --layers N keeps the first N blocks
(num_layers and num_single_layers).

Timed (synchronised, median of --iters calls after one warm-up call of --warmup-steps steps that decodes):
  seconds_per_batch  a pipeline call with output_type="latent" (the denoising loop, prompt handling included);
  decode_seconds     the VAE decode of a call with output_type="pt" (its vae.decode alone; that call runs
                     --decode-steps steps, 2 by default, since its loop is not what it measures);
  images_per_s       batch / (seconds_per_batch + decode_seconds).
transformer_forwards counts the transformer calls of one latent call (steps x 2 with CFG).
"""
import argparse
import contextlib
import inspect
import json
import os
import statistics
import time

import torch
import diffusers
from diffusers import DiffusionPipeline

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
EMBEDDING_PIPELINES = ("QwenImagePipeline", "WanPipeline", "Flux2KleinPipeline")
QWEN_SCHEDULER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "schedulers", "qwen_image.json")


def parse_dtype(text):
    names = {"fp32": "f32", "float32": "f32", "bfloat16": "bf16", "fp16": "f16", "float16": "f16"}
    name = names.get(text, text)
    if name not in DTYPES:
        raise argparse.ArgumentTypeError(f"{text}: expected f32, bf16 or f16")
    return name


def read_json(path):
    with open(path) as f:
        return json.load(f)


def with_layers(config, layers):
    """The config with its first `layers` blocks only (num_layers, and num_single_layers where present)."""
    config = dict(config)
    if layers is not None:
        for key in ("num_layers", "num_single_layers"):
            if key in config:
                config[key] = min(layers, config[key])
    return config


@contextlib.contextmanager
def params_on_meta():
    """Modules built inside create their parameters on the meta device (no memory, no initialisation); buffers and
    plain tensors are created as usual (on the device of an enclosing `torch.device` context)."""
    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def build_random(cls, config, device, dtype, seed):
    """`cls` from `config` with its parameters allocated on `device` in `dtype` (float32 for the class's
    `_keep_in_fp32_modules`, as from_pretrained does) and filled with seeded random values there."""
    with torch.device(device), params_on_meta():
        model = cls.from_config(config)
    keep = (getattr(cls, "_keep_in_fp32_modules", None) or []) if dtype != torch.float32 else []
    gen = torch.Generator(device).manual_seed(seed)
    made = {}
    with torch.no_grad():
        for prefix, module in model.named_modules():
            for name, param in list(module._parameters.items()):
                if param is None:
                    continue
                if param not in made:
                    full = f"{prefix}.{name}".split(".")
                    t = torch.empty(param.shape, device=device,
                                    dtype=torch.float32 if any(k in full for k in keep) else dtype)
                    if t.dim() >= 2:
                        t.normal_(0.0, t[0].numel() ** -0.5, generator=gen)
                    elif name.endswith("weight"):
                        t.fill_(1.0)
                    elif name.endswith("bias"):
                        t.zero_()
                    else:
                        t.normal_(0.0, 0.02, generator=gen)
                    made[param] = torch.nn.Parameter(t, requires_grad=param.requires_grad)
                module._parameters[name] = made[param]
    return model.eval()


def random_pipeline(a, device, dtype):
    """The pipeline of model_index.json with random-weight models, its scheduler, and no text encoder/tokenizer."""
    index = read_json(os.path.join(a.dir, "model_index.json"))
    name = index["_class_name"]
    if name not in EMBEDDING_PIPELINES:
        raise SystemExit(f"--random-weights: {name} is not supported (only {', '.join(EMBEDDING_PIPELINES)}, whose "
                         "__call__ takes prompt embeddings)")
    pipe_cls = getattr(diffusers, name)
    accepted = inspect.signature(pipe_cls.__init__).parameters
    parts = {}
    for key, value in index.items():
        if key.startswith("_") or key not in accepted:
            continue
        if not (isinstance(value, list) and len(value) == 2):
            parts[key] = value  # a pipeline setting: boundary_ratio, expand_timesteps, is_distilled
        elif value[0] != "diffusers":
            parts[key] = None  # the text encoder and tokenizer (or an absent component)
        elif issubclass(getattr(diffusers, value[1]), diffusers.ModelMixin):
            config = read_json(os.path.join(a.dir, key, "config.json"))
            if key.startswith("transformer"):
                config = with_layers(config, a.layers)
            parts[key] = build_random(getattr(diffusers, value[1]), config, device, dtype, a.seed + len(parts))
        else:
            path = os.path.join(a.dir, key, "scheduler_config.json")
            if not os.path.exists(path) and name == "QwenImagePipeline":
                path = QWEN_SCHEDULER
            parts[key] = getattr(diffusers, value[1]).from_config(read_json(path))
    return pipe_cls(**parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--random-weights", action="store_true", help="DIR holds configs only: random weights, "
                    "random prompt embeddings")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", type=parse_dtype, default="f32", help="f32 | bf16 | f16")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--guidance", type=float, default=4.5)
    ap.add_argument("--resolution", type=int, default=512)
    ap.add_argument("--text-tokens", type=int, default=32, help="prompt embedding tokens (--random-weights)")
    ap.add_argument("--layers", type=int, help="keep the transformer's first N blocks (--random-weights)")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--decode-steps", type=int, default=2, help="steps of the call whose decode is timed")
    ap.add_argument("--num-frames", type=int, default=81)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the result as one JSON object here")
    a = ap.parse_args()
    if a.layers is not None and not a.random_weights:
        ap.error("--layers needs --random-weights")
    device, dtype = torch.device(a.device), DTYPES[a.dtype]
    cuda = device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    start = time.perf_counter()
    if a.random_weights:
        pipe = random_pipeline(a, device, dtype)
    else:
        pipe = DiffusionPipeline.from_pretrained(a.dir, torch_dtype=dtype).to(device)
    sync()
    build_seconds = time.perf_counter() - start
    pipe.set_progress_bar_config(disable=True)
    name = type(pipe).__name__

    kwargs = dict(height=a.resolution, width=a.resolution)
    if name == "WanPipeline":
        kwargs["num_frames"] = a.num_frames
    if a.random_weights:
        config = pipe.transformer.config
        dim = config.get("joint_attention_dim") or config.get("text_dim")
        gen = torch.Generator(device).manual_seed(a.seed)
        embeds = [torch.randn(a.batch, a.text_tokens, dim, generator=gen, device=device, dtype=dtype) for _ in range(2)]
        kwargs.update(prompt_embeds=embeds[0], negative_prompt_embeds=embeds[1])
        if name == "QwenImagePipeline":
            mask = torch.ones(a.batch, a.text_tokens, dtype=torch.long, device=device)
            kwargs.update(prompt_embeds_mask=mask, negative_prompt_embeds_mask=mask)
    else:
        kwargs["prompt"] = ["a photo of a red circle next to a blue square"] * a.batch
        if name == "QwenImagePipeline":
            kwargs["negative_prompt"] = [" "] * a.batch
    kwargs["true_cfg_scale" if name == "QwenImagePipeline" else "guidance_scale"] = a.guidance

    decode_times = []
    decode = pipe.vae.decode

    def timed_decode(*args, **kw):
        sync()
        t0 = time.perf_counter()
        out = decode(*args, **kw)
        sync()
        decode_times.append(time.perf_counter() - t0)
        return out

    pipe.vae.decode = timed_decode
    forwards = [0]
    for key in ("transformer", "transformer_2"):
        if isinstance(getattr(pipe, key, None), torch.nn.Module):
            getattr(pipe, key).register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))

    def call(steps, output_type):
        gen = torch.Generator(device).manual_seed(a.seed)
        sync()
        t0 = time.perf_counter()
        pipe(num_inference_steps=steps, output_type=output_type, generator=gen, **kwargs)
        sync()
        return time.perf_counter() - t0

    call(a.warmup_steps, "pt")
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    forwards[0] = 0
    seconds = statistics.median(call(a.steps, "latent") for _ in range(a.iters))
    transformer_forwards = forwards[0] // a.iters
    decode_times.clear()
    for _ in range(a.iters):
        call(a.decode_steps, "pt")
    decode_seconds = statistics.median(decode_times)
    result = {
        "anchor": "diffusers_rollout",
        "pipeline": name,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "dtype": a.dtype,
        "batch": a.batch,
        "steps": a.steps,
        "guidance": a.guidance,
        "resolution": a.resolution,
        "text_tokens": a.text_tokens if a.random_weights else None,
        "num_frames": a.num_frames if name == "WanPipeline" else None,
        "layers": a.layers,
        "iters": a.iters,
        "seconds_per_batch": seconds,
        "decode_seconds": decode_seconds,
        "images_per_s": a.batch / (seconds + decode_seconds),
        "transformer_forwards": transformer_forwards,
        "build_seconds": build_seconds,
        "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
        "diffusers_version": diffusers.__version__,
        "torch_version": torch.__version__,
    }
    frames = f", {a.num_frames} frames" if name == "WanPipeline" else ""
    print(f"diffusers rollout ({name}, {result['device']}, {a.dtype}): batch {a.batch} x {a.steps} steps at "
          f"{a.resolution}px{frames}, CFG {a.guidance}: denoising {seconds * 1e3:.1f} ms per batch "
          f"({transformer_forwards} transformer calls), decode {decode_seconds * 1e3:.1f} ms, "
          f"{result['images_per_s']:.2f} samples/s; built in {build_seconds:.1f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
