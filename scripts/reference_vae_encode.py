"""Reference numbers for flowtune's VAE encoder, from diffusers.

Usage (needs `pip install torch diffusers`):
    python scripts/reference_vae_encode.py fixtures/vae_tiny fixtures/vae_tiny_encode_io.safetensors

Writes `input.image` (random, in [-1, 1]) and `output.mean` / `output.logvar` of
`AutoencoderKL.encode(image).latent_dist` (before scaling_factor / shift_factor).
"""
import sys

import torch
from diffusers import AutoencoderKL
from safetensors.torch import save_file


def main(vae_dir, out):
    vae = AutoencoderKL.from_pretrained(vae_dir).eval()
    g = torch.Generator().manual_seed(0)
    size = vae.config.sample_size
    image = torch.rand(2, vae.config.in_channels, size, size + 8, generator=g) * 2 - 1
    with torch.no_grad():
        dist = vae.encode(image).latent_dist
    save_file({"input.image": image, "output.mean": dist.mean.contiguous(), "output.logvar": dist.logvar.contiguous()}, out)
    print(f"wrote {out}: mean {tuple(dist.mean.shape)}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
