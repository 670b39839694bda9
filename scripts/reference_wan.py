"""Reference fixtures for flowtune's Wan port (diffusers' WanTransformer3DModel, AutoencoderKLWan,
transformers' UMT5EncoderModel).

Usage (the project venv: torch 2.11, diffusers 0.42, transformers, peft):
    python scripts/reference_wan.py fixtures [transformer|vae|umt5 ...]
        writes the fixtures of the named parts (all by default) and their manifest entries.
    python scripts/reference_wan.py --check-pipeline DIR
        loads a tiny pipeline written by `flowtune make-tiny wan DIR` with WanPipeline.from_pretrained
        and runs two denoising steps.

Transformer (kind `wan_transformer`): for each tiny random config, `<name>/` (config.json + weights),
`<name>_lora.safetensors` (a random PEFT LoRA in the diffusers layout) and `<name>_io.safetensors`:
`input.hidden_states` (B, C, F, H, W), `input.timestep` (B,) or per token (B, S) as WanPipeline passes
it with `expand_timesteps` (TI2V: 0 on the first latent frame's tokens), `input.encoder_hidden_states`
(B, L, text_dim) (rows zero-padded beyond the prompt as the pipeline pads them); `output.sample`,
`output.sample_with_lora`, `loss_weight`, `grad.transformer.*` of mean(sample_with_lora · loss_weight).

VAE (kind `wan_vae`): `<name>/` and `<name>_io.safetensors` with, per case, `input.video` (B, 3, T, H, W)
in [-1, 1], `output.mean` (the posterior mean, raw) and `output.logvar`, `input.latents` (normalised, as
the denoiser sees them) and `output.video` = vae.decode(latents · std + mean) (pipeline_wan's
denormalisation), for T = 1, 5 and 9 frames.

Shapes (`wan_real_shapes.json`): the parameter names and shapes of Wan2.1's and Wan2.2's VAEs and of
Wan2.2-TI2V-5B's transformer (one block), from the meta device.

UMT5 (kind `wan_umt5`): `<name>/` (config + weights) and `<name>_io.safetensors`: `input.input_ids`,
`input.attention_mask` (B, L) padded to max_sequence_length, `output.last_hidden_state` (B, L, d) of the
encoder with that mask, `output.prompt_embeds` (B, L, d): WanPipeline's prompt embeds (each row's first
len tokens, zeros beyond).
"""
import math
import os
import sys

import torch
from safetensors.torch import save_file

from transformer_fixtures import lora_case, randomize_, update_manifest

WAN_TARGETS = ["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k",
               "attn2.to_v", "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2"]

TRANSFORMERS = [
    {
        # Wan2.1/2.2 T2V layout: 9 frames → 3 latent frames of 6 × 10 cells, per-sample timesteps.
        "name": "wan_t2v_tiny",
        "config": dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16,
                       out_channels=16, text_dim=24, freq_dim=32, ffn_dim=48, num_layers=2, cross_attn_norm=True,
                       rope_max_seq_len=64),
        "latent": (3, 6, 10),
        "text_len": 9,
        "valid": [4, 9],
        "t": [999.0, 412.5],
        "per_token": False,
        "lora": {"r": 4, "alpha": 8, "targets": WAN_TARGETS},
    },
    {
        # Wan2.2-TI2V layout (48 → tiny 12 channels): 5 frames → 2 latent frames, per-token timesteps with
        # the first frame's tokens at 0 (the image-conditioned rows of expand_timesteps).
        "name": "wan_ti2v_tiny",
        "config": dict(patch_size=(1, 2, 2), num_attention_heads=3, attention_head_dim=16, in_channels=12,
                       out_channels=12, text_dim=20, freq_dim=16, ffn_dim=40, num_layers=2, cross_attn_norm=False,
                       rope_max_seq_len=32),
        "latent": (2, 4, 6),
        "text_len": 6,
        "valid": [6, 2],
        "t": [875.0, 250.0],
        "per_token": True,
        "lora": {"r": 3, "alpha": 6, "targets": "all-linear"},
    },
    {
        # One frame (a picture), a temporal patch of 1, non-square 4 × 8 cells, one sample.
        "name": "wan_image_tiny",
        "config": dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=18, in_channels=4,
                       out_channels=4, text_dim=16, freq_dim=24, ffn_dim=24, num_layers=1, cross_attn_norm=True,
                       eps=1e-5, rope_max_seq_len=16),
        "latent": (1, 4, 8),
        "text_len": 5,
        "valid": [3],
        "t": [500.0],
        "per_token": False,
        "lora": {"r": 2, "alpha": 2, "targets": WAN_TARGETS},
    },
]


def transformer_case(spec, out_dir, g):
    from diffusers import WanTransformer3DModel

    name = spec["name"]
    model = WanTransformer3DModel(**spec["config"]).eval()
    randomize_(model, g)
    model.save_pretrained(os.path.join(out_dir, name), safe_serialization=True)
    c = model.config
    b = len(spec["t"])
    f, h, w = spec["latent"]
    x = torch.randn(b, c.in_channels, f, h, w, generator=g)
    text = torch.randn(b, spec["text_len"], c.text_dim, generator=g)
    for row, n in enumerate(spec["valid"]):
        text[row, n:] = 0
    t = torch.tensor(spec["t"], dtype=torch.float32)
    if spec["per_token"]:
        p_t, p_h, p_w = c.patch_size
        mask = torch.ones(1, 1, f, h, w)
        mask[:, :, 0] = 0
        t = torch.stack([(mask[0][0][:, ::p_h, ::p_w] * ti).flatten() for ti in t])
    inp = {"hidden_states": x, "timestep": t, "encoder_hidden_states": text}

    def run():
        return model(x, t, text, return_dict=False)[0]

    with torch.no_grad():
        out = run()
    io = {f"input.{k}": v for k, v in inp.items()}
    io["output.sample"] = out
    return lora_case(model, run, name, "wan_transformer", spec["lora"], io, out_dir, g)


def transformers_part(out_dir):
    g = torch.Generator().manual_seed(20261124)
    entries = [transformer_case(spec, out_dir, g) for spec in TRANSFORMERS]
    update_manifest(out_dir, entries, "wan_transformer")
    for e in entries:
        print(e["name"], "lora params", e["lora_params"], "adapted", len(e["adapted_modules"]),
              "output |mean|", e["output_abs_mean"])


VAES = {
    # Wan2.1's layout (four levels, temporal downsampling in the last two) at width 4, z 4; 8× spatial.
    "wan21_vae_tiny": {
        "seed": 31, "batch": 2, "hw": (16, 24),
        "config": dict(base_dim=4, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
                       temperal_downsample=[False, True, True], scale_factor_spatial=8, scale_factor_temporal=4),
    },
    # Wan2.2's layout: residual blocks, a wider decoder, 2×2 pixel patches (12 channels), z 8; 16× spatial.
    "wan22_vae_tiny": {
        "seed": 32, "batch": 1, "hw": (32, 48),
        "config": dict(base_dim=4, decoder_base_dim=8, z_dim=8, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                       attn_scales=[], temperal_downsample=[False, True, True], is_residual=True, in_channels=12,
                       out_channels=12, patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4),
    },
}

FRAMES = [1, 5, 9]


def randomize_vae(model, seed):
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


def vae_case(name, spec, out_dir):
    from diffusers import AutoencoderKLWan

    g = torch.Generator().manual_seed(spec["seed"])
    z = spec["config"]["z_dim"]
    stats = dict(latents_mean=(torch.randn(z, generator=g) * 0.5).tolist(),
                 latents_std=(torch.rand(z, generator=g) * 1.5 + 0.5).tolist())
    vae = AutoencoderKLWan(**spec["config"], **stats).eval()
    randomize_vae(vae, spec["seed"])
    vae.save_pretrained(os.path.join(out_dir, name), safe_serialization=True)
    mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1)
    b, (h, w) = spec["batch"], spec["hw"]
    f = vae.config.scale_factor_spatial
    io = {}
    with torch.no_grad():
        for t in FRAMES:
            video = torch.rand(b, 3, t, h, w, generator=g) * 2 - 1
            dist = vae.encode(video).latent_dist
            frames = (t - 1) // vae.config.scale_factor_temporal + 1
            latents = torch.randn(b, z, frames, h // f, w // f, generator=g)
            decoded = vae.decode(latents / inv_std + mean, return_dict=False)[0]
            io.update({
                f"t{t}.input.video": video,
                f"t{t}.output.mean": dist.mean,
                f"t{t}.output.logvar": dist.logvar,
                f"t{t}.input.latents": latents,
                f"t{t}.output.video": decoded,
            })
    save_file({k: v.contiguous() for k, v in io.items()}, os.path.join(out_dir, f"{name}_io.safetensors"))
    return {"name": name, "kind": "wan_vae", "model": name, "class": "AutoencoderKLWan", "frames": FRAMES,
            "output_abs_mean": io["t9.output.video"].abs().mean().item()}


def vaes_part(out_dir):
    entries = [vae_case(name, spec, out_dir) for name, spec in VAES.items()]
    update_manifest(out_dir, entries, "wan_vae")
    for e in entries:
        print(e["name"], "decoded |mean|", e["output_abs_mean"])


UMT5 = {
    "name": "wan_umt5_tiny",
    "config": dict(vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=3, num_heads=4,
                   relative_attention_num_buckets=8, relative_attention_max_distance=16,
                   feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, pad_token_id=0, eos_token_id=1),
    # Prompts of 5 and 12 tokens padded to 12 (the longest), prompt embeds padded to 16.
    "lengths": [5, 12],
    "max_sequence_length": 16,
}


def umt5_part(out_dir):
    from transformers import UMT5Config, UMT5EncoderModel

    g = torch.Generator().manual_seed(41)
    name = UMT5["name"]
    model = UMT5EncoderModel(UMT5Config(**UMT5["config"])).eval()
    with torch.no_grad():
        for p_name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.1 * noise if "layer_norm" in p_name else 0.3 * noise)
    model.save_pretrained(os.path.join(out_dir, name), safe_serialization=True)
    lengths, length = UMT5["lengths"], UMT5["max_sequence_length"]
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(2, UMT5["config"]["vocab_size"], (n,), generator=g)
        ids[row, n - 1] = 1
        mask[row, :n] = 1
    with torch.no_grad():
        hidden = model(ids, mask).last_hidden_state
    # WanPipeline._get_t5_prompt_embeds: each row's first seq_len states, zeros up to max_sequence_length.
    seq_lens = mask.gt(0).sum(dim=1).long()
    rows = [u[:v] for u, v in zip(hidden, seq_lens)]
    embeds = torch.stack([torch.cat([u, u.new_zeros(length - u.size(0), u.size(1))]) for u in rows], dim=0)
    io = {"input.input_ids": ids, "input.attention_mask": mask, "output.last_hidden_state": hidden,
          "output.prompt_embeds": embeds}
    save_file({k: v.contiguous() for k, v in io.items()}, os.path.join(out_dir, f"{name}_io.safetensors"))
    update_manifest(out_dir, [{"name": name, "kind": "wan_umt5", "model": name, "class": "UMT5EncoderModel",
                               "max_sequence_length": length}], "wan_umt5")
    print(name, "hidden |mean|", hidden.abs().mean().item())


# The released layouts (statistics are placeholders: only names and shapes are compared).
REAL_LAYOUTS = {
    "wan21_vae": ("AutoencoderKLWan", {}),
    "wan22_vae": ("AutoencoderKLWan", dict(base_dim=160, decoder_base_dim=256, z_dim=48, is_residual=True,
                                           in_channels=12, out_channels=12, patch_size=2, scale_factor_spatial=16,
                                           latents_mean=[0.0] * 48, latents_std=[1.0] * 48)),
    # Wan2.2-TI2V-5B with one of its 30 blocks.
    "wan22_ti2v_transformer_1_block": ("WanTransformer3DModel", dict(
        num_attention_heads=24, attention_head_dim=128, in_channels=48, out_channels=48, text_dim=4096,
        freq_dim=256, ffn_dim=14336, num_layers=1, cross_attn_norm=True, eps=1e-6, rope_max_seq_len=1024)),
}


def shapes_part(out_dir):
    """`wan_real_shapes.json`: every parameter name and shape of the released layouts, built on the meta
    device (no weights)."""
    import json

    import diffusers

    out = {}
    for name, (cls, config) in REAL_LAYOUTS.items():
        with torch.device("meta"):
            model = getattr(diffusers, cls)(**config)
        out[name] = {"class": cls, "config": {k: v for k, v in model.config.items() if not k.startswith("_")},
                     "shapes": {k: list(p.shape) for k, p in model.state_dict().items()}}
    with open(os.path.join(out_dir, "wan_real_shapes.json"), "w") as f:
        json.dump(out, f, indent=0)
        f.write("\n")
    print("wan_real_shapes.json:", {k: len(v["shapes"]) for k, v in out.items()})


PARTS = {"transformer": transformers_part, "vae": vaes_part, "umt5": umt5_part, "shapes": shapes_part}


def check_pipeline(path):
    """A `flowtune make-tiny wan` folder: every component loads with no missing or unexpected weights, and
    WanPipeline runs two denoising steps on a 5-frame video."""
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel
    from transformers import UMT5EncoderModel

    for cls, sub in [(WanTransformer3DModel, "transformer"), (AutoencoderKLWan, "vae"),
                     (UMT5EncoderModel, "text_encoder")]:
        _, info = cls.from_pretrained(os.path.join(path, sub), output_loading_info=True)
        bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
        assert not bad, f"{sub}: {bad}"
    pipe = WanPipeline.from_pretrained(path)
    unit = pipe.vae_scale_factor_spatial * pipe.transformer.config.patch_size[1]
    video = pipe("a red ball", negative_prompt="", height=2 * unit, width=4 * unit, num_frames=5,
                 num_inference_steps=2, guidance_scale=4.0, output_type="pt",
                 generator=torch.Generator().manual_seed(0)).frames
    assert torch.isfinite(video).all()
    print(f"{path}: WanPipeline (expand_timesteps={pipe.config.expand_timesteps}) ran 2 steps, "
          f"frames {tuple(video.shape)}, mean {video.mean().item():.4f}")


def main(argv):
    if argv and argv[0] == "--check-pipeline":
        for path in argv[1:]:
            check_pipeline(path)
        return
    out_dir = argv[0] if argv else "fixtures"
    torch.manual_seed(0)
    for part in argv[1:] or list(PARTS):
        PARTS[part](out_dir)


if __name__ == "__main__":
    main(sys.argv[1:])
