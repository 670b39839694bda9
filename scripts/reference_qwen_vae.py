"""Reference numbers for flowtune's Qwen-Image VAE (`AutoencoderKLQwenImage`), from diffusers.

Usage (the project venv: torch 2.11, diffusers 0.42):
    python scripts/reference_qwen_vae.py fixtures
        writes, for each tiny random config below, `fixtures/<name>/` (config.json and weights, via
        `save_pretrained`) and `fixtures/<name>_io.safetensors`, and adds `kind: qwen_vae` entries
        to `fixtures/manifest.json`.
    python scripts/reference_qwen_vae.py --check DIR
        checks that a checkpoint written by flowtune (`write_tiny_qwen_vae`) loads with
        `from_pretrained` with no missing or unexpected keys, and decodes.

The io file holds, in f32:
  input.latents        (B, z, h, w) normalised latents, as the pipeline's denoiser produces them
  output.image         (B, 3, H, W) = vae.decode(latents * std + mean)[:, :, 0]  (pipeline_qwenimage)
  input.image          (B, 3, H, W) in [-1, 1]
  output.mean          (B, z, h, w) posterior mean of vae.encode(image[:, :, None]) (raw)
  output.logvar        (B, z, h, w) posterior log-variance (raw, clamped as diffusers does)
  output.image_latents (B, z, h, w) (mode - mean) / std  (pipeline_qwenimage_edit_plus._encode_vae_image)
  input.video, output.video_mean, input.video_latents, output.video: the same on 5-D video
    (B, C, F, H, W), through the frame-chunked feature cache.
and `fixtures/qwen_vae_default_shapes.json`: every tensor name and shape of the default
(Qwen-Image) config, without weights.
"""
import json
import math
import os
import sys

import torch
from diffusers import AutoencoderKLQwenImage
from safetensors.torch import save_file

CASES = {
    # The real layout (four levels, temporal downsampling in the last two) at a tiny width; a
    # non-square picture.
    "qwen_vae_tiny": {
        "seed": 21, "batch": 2, "latent_hw": [6, 10], "video": [5, 2, 3],
        "config": {"base_dim": 4, "z_dim": 16, "dim_mult": [1, 2, 2, 2], "num_res_blocks": 1,
                   "attn_scales": [], "temperal_downsample": [False, True, True]},
    },
    # Three levels with uneven widths (the decoder halves 12 channels to 6), two resnets per
    # level, attention in the encoder at scale 1/2.
    "qwen_vae_attn": {
        "seed": 22, "batch": 1, "latent_hw": [8, 12], "video": [5, 4, 3],
        "config": {"base_dim": 4, "z_dim": 16, "dim_mult": [1, 3, 2], "num_res_blocks": 2,
                   "attn_scales": [0.5], "temperal_downsample": [False, True]},
    },
}


def run_encoder_attention():
    """diffusers 0.42 calls every encoder down block with the frame cache, which
    `QwenImageAttentionBlock.forward` does not take (no released checkpoint has `attn_scales`).
    Attention uses no cache, so the reference lets it take and ignore those arguments."""
    from diffusers.models.autoencoders import autoencoder_kl_qwenimage as m

    forward = m.QwenImageAttentionBlock.forward
    m.QwenImageAttentionBlock.forward = lambda self, x, *cache: forward(self, x)


def randomize(model, seed):
    """Weights N(0, 1/fan-in), biases N(0, 0.1²), RMS-norm scales 1 + N(0, 0.1²)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("gamma"):
                p.copy_(1 + 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(noise / math.sqrt(p[0].numel()))


def stats(vae):
    z = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1)
    return mean, std


def decode(vae, latents):
    """pipeline_qwenimage: `latents / (1 / std) + mean`, decode."""
    mean, std = stats(vae)
    return vae.decode(latents / (1.0 / std) + mean, return_dict=False)[0]


def encode(vae, x):
    dist = vae.encode(x).latent_dist
    mean, std = stats(vae)
    return dist, (dist.mode() - mean) / std


def make(out_dir, name, case):
    torch.manual_seed(0)
    vae = AutoencoderKLQwenImage(**case["config"]).eval()
    randomize(vae, case["seed"])
    model_dir = os.path.join(out_dir, name)
    vae.save_pretrained(model_dir)
    vae = AutoencoderKLQwenImage.from_pretrained(model_dir).eval()

    g = torch.Generator().manual_seed(case["seed"])
    z = vae.config.z_dim
    factor = 2 ** (len(vae.config.dim_mult) - 1)
    b, (h, w) = case["batch"], case["latent_hw"]
    frames, vh, vw = case["video"]
    latents = torch.randn(b, z, h, w, generator=g)
    image = torch.rand(b, 3, h * factor, w * factor, generator=g) * 2 - 1
    video = torch.rand(1, 3, frames, vh * factor, vw * factor, generator=g) * 2 - 1
    with torch.no_grad():
        decoded = decode(vae, latents[:, :, None])[:, :, 0]
        dist, image_latents = encode(vae, image[:, :, None])
        video_dist, _ = encode(vae, video)
        video_latents = torch.randn(video_dist.mean.shape, generator=g)
        decoded_video = decode(vae, video_latents)
    tensors = {
        "input.latents": latents,
        "output.image": decoded,
        "input.image": image,
        "output.mean": dist.mean[:, :, 0],
        "output.logvar": dist.logvar[:, :, 0],
        "output.image_latents": image_latents[:, :, 0],
        "input.video": video,
        "output.video_mean": video_dist.mean,
        "input.video_latents": video_latents,
        "output.video": decoded_video,
    }
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out_dir, f"{name}_io.safetensors"))
    clamped = (decoded.abs() >= 1).float().mean().item()
    print(f"{name}: image {tuple(decoded.shape)} ({clamped:.0%} at ±1), latents {tuple(dist.mean.shape)}, "
          f"video {tuple(video.shape)} -> {tuple(video_dist.mean.shape)} -> {tuple(decoded_video.shape)}")
    return {
        "name": name,
        "kind": "qwen_vae",
        "model": name,
        "class": "AutoencoderKLQwenImage",
        "note": "output.image = decode(latents * latents_std + latents_mean)[:, :, 0]; "
                "output.image_latents = (encode(image).mode() - latents_mean) / latents_std",
    }


def default_shapes(out_dir):
    with torch.device("meta"):
        vae = AutoencoderKLQwenImage()
    shapes = {k: list(v.shape) for k, v in sorted(vae.state_dict().items())}
    with open(os.path.join(out_dir, "qwen_vae_default_shapes.json"), "w") as f:
        json.dump(shapes, f, indent=0)
        f.write("\n")
    print(f"qwen_vae_default_shapes.json: {len(shapes)} tensors")


def check(model_dir):
    vae, info = AutoencoderKLQwenImage.from_pretrained(model_dir, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    assert not problems, f"{model_dir}: {problems}"
    with torch.no_grad():
        image = decode(vae, torch.randn(1, vae.config.z_dim, 1, 2, 3))
    print(f"{model_dir}: loads with no missing or unexpected keys; decodes to {tuple(image.shape)}")


def main(args):
    if args[0] == "--check":
        check(args[1])
        return
    out_dir = args[0]
    run_encoder_attention()
    entries = [make(out_dir, name, case) for name, case in CASES.items()]
    default_shapes(out_dir)
    manifest_path = os.path.join(out_dir, "manifest.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    manifest["models"] = [m for m in manifest["models"] if m["name"] not in CASES] + entries
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
