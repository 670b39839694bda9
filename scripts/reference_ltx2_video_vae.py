"""Reference fixtures for flowtune's port of diffusers' AutoencoderKLLTX2Video (LTX-2's video VAE).

Usage (the project venv: torch 2.11, diffusers 0.42):
    python scripts/reference_ltx2_video_vae.py fixtures

Kind `ltx2_video_vae`: for each tiny random config, `<name>/` (config.json + weights, buffers
`latents_mean` / `latents_std` included) and `<name>_io.safetensors` with, per frame count T in {1, 9}:
`t{T}.input.video` (B, 3, T, H, W) in [-1, 1] (float16 values, to keep the file small; encode them as f32),
`t{T}.output.mean` / `t{T}.output.logvar` (the posterior of vae.encode), `t{T}.output.normalized`
(LTX2Pipeline._normalize_latents of that mean with the config's scaling_factor), `t{T}.input.latents`
(B, C, 1 + (T - 1) / 8, h, w) raw, `t{T}.output.denormalized` (_denormalize_latents of them) and
`t{T}.output.video` = vae.decode(latents, timestep) at frames `output_frames` of the manifest entry only;
`input.timestep` (B,) for the timestep-conditioned config.
`ltx2_video_vae_tiny` is flowtune's `Ltx2VideoVaeConfig::tiny()` (LTX-2.0's blocks and compression at tiny
widths, centred decoder, reflect padding; no residual in the last upsampler, whose 4 channels do not fold
by 8); `ltx2_video_vae_cond` has decoder timestep conditioning, a causal
decoder, 2x2 patches, a strided-conv downsampler, channel-keeping upsamplers (factor 1, the first with
residual), replicate/zeros padding and scaling_factor 0.7.

`ltx2_video_vae_shapes.json`: every tensor name and shape of the released configs (LTX-2.0's and LTX-2.3's
`examples/models/<name>/vae/config.json`), built on the meta device.
"""
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformer_fixtures import update_manifest  # noqa: E402

RELEASED = dict(
    decoder_causal=False, spatial_compression_ratio=32, temporal_compression_ratio=8,
)

CASES = {
    "ltx2_video_vae_tiny": {
        "seed": 41, "batch": 1, "hw": (32, 64), "latent_hw": (2, 2), "timestep": None,
        "config": dict(
            latent_channels=4, block_out_channels=(4, 8, 8, 8), decoder_block_out_channels=(4, 8, 16),
            layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
            upsample_residual=(False, True, True), **RELEASED,
        ),
    },
    "ltx2_video_vae_cond": {
        "seed": 42, "batch": 2, "hw": (16, 32), "latent_hw": (2, 2), "timestep": [0.05, 0.6],
        "config": dict(
            latent_channels=4, block_out_channels=(4, 8, 8, 8), decoder_block_out_channels=(4, 8, 8),
            layers_per_block=(1, 2, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
            spatio_temporal_scaling=True, downsample_type=("spatial", "temporal", "conv", "spatiotemporal"),
            upsample_factor=(1, 2, 1), upsample_residual=(False, False, True), timestep_conditioning=True,
            patch_size=2, scaling_factor=0.7, encoder_causal=True, decoder_causal=True,
            encoder_spatial_padding_mode="replicate", decoder_spatial_padding_mode="zeros",
            spatial_compression_ratio=16, temporal_compression_ratio=8,
        ),
    },
}

FRAMES = [1, 9]
OUTPUT_FRAMES = [0, 4, 8]


def randomize(model, seed):
    """Weights N(0, 1/fan-in), biases N(0, 0.1²), 1-D weights (layer norms) 1 + N(0, 0.1²), scale-shift
    tables N(0, 1/C); timestep_scale_multiplier stays 1000."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() == 0:
                continue
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("bias"):
                p.copy_(0.1 * noise)
            elif p.dim() == 1:
                p.copy_(1 + 0.1 * noise)
            else:
                p.copy_(noise / math.sqrt(p[0].numel()))
        z = model.latents_mean.shape[0]
        model.latents_mean.copy_(torch.randn(z, generator=g) * 0.5)
        model.latents_std.copy_(torch.rand(z, generator=g) * 1.5 + 0.5)
    return g


def case(name, spec, out_dir):
    from diffusers import AutoencoderKLLTX2Video
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline

    vae = AutoencoderKLLTX2Video(**spec["config"]).eval()
    g = randomize(vae, spec["seed"])
    vae.save_pretrained(os.path.join(out_dir, name), safe_serialization=True)
    mean, std, sf = vae.latents_mean, vae.latents_std, vae.config.scaling_factor
    b, (h, w), (lh, lw) = spec["batch"], spec["hw"], spec["latent_hw"]
    z = vae.config.latent_channels
    io = {}
    timestep = None
    if spec["timestep"] is not None:
        timestep = torch.tensor(spec["timestep"])
        io["input.timestep"] = timestep
    with torch.no_grad():
        for t in FRAMES:
            video = (torch.rand(b, 3, t, h, w, generator=g) * 2 - 1).half()
            dist = vae.encode(video.float()).latent_dist
            frames = (t - 1) // vae.temporal_compression_ratio + 1
            latents = torch.randn(b, z, frames, lh, lw, generator=g)
            decoded = vae.decode(latents, timestep, return_dict=False)[0]
            keep = [f for f in OUTPUT_FRAMES if f < decoded.shape[2]]
            io.update({
                f"t{t}.input.video": video,
                f"t{t}.output.mean": dist.mean,
                f"t{t}.output.logvar": dist.logvar,
                f"t{t}.output.normalized": LTX2Pipeline._normalize_latents(dist.mean, mean, std, sf),
                f"t{t}.input.latents": latents,
                f"t{t}.output.denormalized": LTX2Pipeline._denormalize_latents(latents, mean, std, sf),
                f"t{t}.output.video": decoded[:, :, keep],
            })
    save_file({k: v.contiguous() for k, v in io.items()}, os.path.join(out_dir, f"{name}_io.safetensors"))
    return {"name": name, "kind": "ltx2_video_vae", "model": name, "class": "AutoencoderKLLTX2Video",
            "frames": FRAMES, "output_frames": OUTPUT_FRAMES,
            "spatial_compression_ratio": vae.spatial_compression_ratio,
            "temporal_compression_ratio": vae.temporal_compression_ratio,
            "output_abs_mean": io["t9.output.video"].abs().mean().item()}


def shapes(out_dir):
    from diffusers import AutoencoderKLLTX2Video

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "models")
    out = {}
    for name in ["ltx-2", "ltx-2.3"]:
        config = AutoencoderKLLTX2Video.load_config(os.path.join(root, name, "vae"))
        with torch.device("meta"):
            model = AutoencoderKLLTX2Video.from_config(config)
        out[name] = {"config": {k: v for k, v in model.config.items() if not k.startswith("_")},
                     "shapes": {k: list(p.shape) for k, p in model.state_dict().items()}}
    with open(os.path.join(out_dir, "ltx2_video_vae_shapes.json"), "w") as f:
        json.dump(out, f, indent=0)
        f.write("\n")
    print("ltx2_video_vae_shapes.json:", {k: len(v["shapes"]) for k, v in out.items()})


def main(out_dir):
    entries = [case(name, spec, out_dir) for name, spec in CASES.items()]
    update_manifest(out_dir, entries, "ltx2_video_vae")
    for e in entries:
        print(e["name"], "decoded |mean|", e["output_abs_mean"])
    shapes(out_dir)


if __name__ == "__main__":
    main(sys.argv[1])
