"""Reference fixtures for flowtune's LTX-2 audio port (diffusers' AutoencoderKLLTX2Audio, LTX2Vocoder and
LTX2VocoderWithBWE).

Usage (the project venv: torch 2.11, diffusers 0.42):
    flock fixtures/.manifest.lock python scripts/reference_ltx2_audio.py fixtures [vae|vocoder ...]
        writes the fixtures of the named parts (all by default) and their manifest entries.
    python scripts/reference_ltx2_audio.py --check DIR ...
        loads folders written by flowtune's `write_random` (audio VAE or vocoder, by _class_name) with
        diffusers and runs them once.

Audio VAE (kind `ltx2_audio_vae`): `<name>/` (config + weights, random `latents_mean` / `latents_std`) and
`<name>_io.safetensors`: `input.mel` (B, C, T, mel) → `output.mean`, `output.logvar` of the posterior;
`input.latents` (B, latent, L, mel/4) → `output.decoded` = decode(latents); `input.tokens` (B, L, latent·mel/4),
packed normalised latents as the denoiser sees them → `output.tokens_decoded` = decode(unpack(denormalize(tokens)))
as LTX2Pipeline does (`_denormalize_audio_latents`, `_unpack_audio_latents`), and
`output.tokens_decoded_bf16` the same with the model and tokens in bf16 (stored as f32).

Vocoder (kind `ltx2_vocoder`): `<name>/` and `<name>_io.safetensors`: `input.mel` (B, C, frames, mel) →
`output.waveform` = vocoder(mel), as LTX2Pipeline calls it, and `output.waveform_bf16` with the model and mel in
bf16 (`conv_out` weights scaled by 0.1 so that little of the waveform is clamped). The BWE vocoder's STFT basis (a
Hann-windowed DFT) and mel filterbank are set here (diffusers initialises them to zeros; real checkpoints carry them).
"""
import copy
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file

from transformer_fixtures import update_manifest

VAES = {
    # The released layout (pixel norm, causal in time) at tiny width: 16 mel bins, 2 latent channels, so that
    # packed tokens are 2 × 4 = 8 = base_channels wide.
    "ltx2_audio_vae_tiny": {
        "seed": 71, "batch": 2, "frames": 17, "latent_frames": 5,
        "config": dict(base_channels=8, ch_mult=(1, 2, 2), num_res_blocks=1, latent_channels=2, mel_bins=16),
    },
    # Causal along mel instead, attention in the mid block and at the half-resolution level, 12 mel bins,
    # an odd frame count.
    "ltx2_audio_vae_attn": {
        "seed": 72, "batch": 1, "frames": 10, "latent_frames": 3,
        "config": dict(base_channels=6, ch_mult=(1, 2, 2), num_res_blocks=1, latent_channels=2, mel_bins=12,
                       causality_axis="width", mid_block_add_attention=True, attn_resolutions=(128,),
                       resolution=256),
    },
}

TINY_VOCODER = dict(in_channels=32, hidden_channels=32, upsample_kernel_sizes=[8, 4], upsample_factors=[4, 2],
                    resnet_kernel_sizes=[3, 5], resnet_dilations=[[1, 3], [1, 2]])

VOCODERS = {
    # LTX-2's layout: leaky ReLU, tanh output.
    "ltx2_vocoder_tiny": {"seed": 81, "class": "LTX2Vocoder", "batch": 2, "frames": 9, "config": TINY_VOCODER},
    # Snake (α only) in the blocks without anti-aliasing, the anti-aliased Snake-β output, clamped, no bias.
    "ltx2_vocoder_snake": {
        "seed": 82, "class": "LTX2Vocoder", "batch": 1, "frames": 6,
        "config": dict(TINY_VOCODER, act_fn="snake", antialias=False, final_act_fn="clamp", final_bias=False,
                       antialias_kernel_size=7, output_sampling_rate=16000),
    },
    # LTX-2.3's layout (anti-aliased Snake-β in both generators): hop 6 does not divide the first stage's
    # 8 × 7 samples, so they are padded before the STFT.
    "ltx2_vocoder_bwe_tiny": {
        "seed": 83, "class": "LTX2VocoderWithBWE", "batch": 2, "frames": 7,
        "config": dict(TINY_VOCODER, bwe_in_channels=16, bwe_hidden_channels=32, bwe_upsample_kernel_sizes=[9, 7, 4],
                       bwe_upsample_factors=[3, 3, 2], bwe_resnet_kernel_sizes=[3], bwe_resnet_dilations=[[1, 2]],
                       filter_length=32, hop_length=6, window_length=32, num_mel_channels=8),
    },
}


def randomize(model, g):
    """Weights N(0, 1/fan-in), biases N(0, 0.1²), 1-D weights 1 + N(0, 0.1²), Snake α/β N(0, 0.1²)."""
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("bias"):
                p.copy_(0.1 * noise)
            elif name.endswith(".alpha") or name.endswith(".beta"):
                p.copy_(0.1 * noise)
            elif p.ndim == 1:
                p.copy_(1 + 0.1 * noise)
            else:
                p.copy_(noise / math.sqrt(p[0].numel()))


def vae_case(name, spec, out_dir):
    from diffusers import AutoencoderKLLTX2Audio
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline

    g = torch.Generator().manual_seed(spec["seed"])
    vae = AutoencoderKLLTX2Audio(**spec["config"]).eval()
    randomize(vae, g)
    c = vae.config
    with torch.no_grad():
        vae.latents_mean.copy_(torch.randn(c.base_channels, generator=g) * 0.5)
        vae.latents_std.copy_(torch.rand(c.base_channels, generator=g) * 1.5 + 0.5)
    vae.save_pretrained(os.path.join(out_dir, name), safe_serialization=True)
    b, t, lf = spec["batch"], spec["frames"], spec["latent_frames"]
    m = c.mel_bins // vae.mel_compression_ratio
    mel = torch.randn(b, c.in_channels, t, c.mel_bins, generator=g)
    latents = torch.randn(b, c.latent_channels, lf, m, generator=g)
    tokens = torch.randn(b, lf, c.latent_channels * m, generator=g)
    with torch.no_grad():
        dist = vae.encode(mel).latent_dist
        decoded = vae.decode(latents, return_dict=False)[0]
        unpacked = LTX2Pipeline._unpack_audio_latents(
            LTX2Pipeline._denormalize_audio_latents(tokens, vae.latents_mean, vae.latents_std), lf, num_mel_bins=m)
        tokens_decoded = vae.decode(unpacked, return_dict=False)[0]
        half = copy.deepcopy(vae).to(torch.bfloat16)
        unpacked = LTX2Pipeline._unpack_audio_latents(
            LTX2Pipeline._denormalize_audio_latents(tokens.bfloat16(), half.latents_mean, half.latents_std), lf,
            num_mel_bins=m)
        tokens_decoded_bf16 = half.decode(unpacked, return_dict=False)[0].float()
    io = {"input.mel": mel, "output.mean": dist.mean, "output.logvar": dist.logvar, "input.latents": latents,
          "output.decoded": decoded, "input.tokens": tokens, "output.tokens_decoded": tokens_decoded,
          "output.tokens_decoded_bf16": tokens_decoded_bf16}
    save_file({k: v.contiguous() for k, v in io.items()}, os.path.join(out_dir, f"{name}_io.safetensors"))
    return {"name": name, "kind": "ltx2_audio_vae", "model": name, "class": "AutoencoderKLLTX2Audio",
            "decoded_shape": list(decoded.shape), "output_abs_mean": decoded.abs().mean().item()}


def hann_dft(filter_length, window_length):
    freqs = filter_length // 2 + 1
    n = torch.arange(filter_length, dtype=torch.float64)
    window = torch.zeros(filter_length, dtype=torch.float64)
    offset = (filter_length - window_length) // 2
    window[offset:offset + window_length] = torch.hann_window(window_length, periodic=True, dtype=torch.float64)
    angle = 2 * math.pi * torch.arange(freqs, dtype=torch.float64)[:, None] * n[None, :] / filter_length
    basis = torch.cat([torch.cos(angle), -torch.sin(angle)]) * window
    return basis.float().unsqueeze(1)


def mel_bank(mels, freqs, sample_rate):
    to_mel = lambda f: 2595 * math.log10(1 + f / 700)  # noqa: E731
    to_hz = lambda m: 700 * (10 ** (m / 2595) - 1)  # noqa: E731
    top = to_mel(sample_rate / 2)
    edges = [to_hz(top * i / (mels + 1)) for i in range(mels + 2)]
    hz = torch.arange(freqs, dtype=torch.float64) * (sample_rate / 2 / (freqs - 1))
    bank = torch.zeros(mels, freqs, dtype=torch.float64)
    for i in range(mels):
        lo, mid, hi = edges[i:i + 3]
        bank[i] = torch.minimum((hz - lo) / (mid - lo), (hi - hz) / (hi - mid)).clamp(min=0)
    return bank.float()


def vocoder_case(name, spec, out_dir):
    import diffusers.pipelines.ltx2.vocoder as voc

    g = torch.Generator().manual_seed(spec["seed"])
    model = getattr(voc, spec["class"])(**spec["config"]).eval()
    randomize(model, g)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("conv_out.weight"):
                p.mul_(0.1)  # keeps the waveforms inside the final clamp
    c = model.config
    if spec["class"] == "LTX2VocoderWithBWE":
        stft = model.mel_stft
        with torch.no_grad():
            basis = hann_dft(c.filter_length, c.window_length)
            stft.stft_fn.forward_basis.copy_(basis)
            stft.stft_fn.inverse_basis.copy_(basis / c.filter_length)
            stft.mel_basis.copy_(mel_bank(c.num_mel_channels, c.filter_length // 2 + 1, c.input_sampling_rate))
    model.save_pretrained(os.path.join(out_dir, name), safe_serialization=True)
    b, frames = spec["batch"], spec["frames"]
    channels = c.out_channels
    mel = torch.randn(b, channels, frames, c.in_channels // channels, generator=g)
    with torch.no_grad():
        waveform = model(mel)
        waveform_bf16 = copy.deepcopy(model).to(torch.bfloat16)(mel.bfloat16()).float()
    io = {"input.mel": mel, "output.waveform": waveform, "output.waveform_bf16": waveform_bf16}
    save_file({k: v.contiguous() for k, v in io.items()}, os.path.join(out_dir, f"{name}_io.safetensors"))
    return {"name": name, "kind": "ltx2_vocoder", "model": name, "class": spec["class"],
            "waveform_shape": list(waveform.shape), "sample_rate": c.output_sampling_rate,
            "output_abs_mean": waveform.abs().mean().item()}


def vae_part(out_dir):
    entries = [vae_case(name, spec, out_dir) for name, spec in VAES.items()]
    update_manifest(out_dir, entries, "ltx2_audio_vae")
    for e in entries:
        print(e["name"], "decoded", e["decoded_shape"], "|mean|", e["output_abs_mean"])


def vocoder_part(out_dir):
    entries = [vocoder_case(name, spec, out_dir) for name, spec in VOCODERS.items()]
    update_manifest(out_dir, entries, "ltx2_vocoder")
    for e in entries:
        print(e["name"], "waveform", e["waveform_shape"], "|mean|", e["output_abs_mean"])


def check(path):
    from diffusers import AutoencoderKLLTX2Audio
    import diffusers.pipelines.ltx2.vocoder as voc

    cls = json.load(open(os.path.join(path, "config.json")))["_class_name"]
    model = (AutoencoderKLLTX2Audio if cls == "AutoencoderKLLTX2Audio" else getattr(voc, cls)).from_pretrained(path)
    c = model.config
    with torch.no_grad():
        if cls == "AutoencoderKLLTX2Audio":
            out = model.decode(torch.randn(1, c.latent_channels, 3, c.mel_bins // 4), return_dict=False)[0]
        else:
            out = model(torch.randn(1, c.out_channels, 5, c.in_channels // c.out_channels))
    assert torch.isfinite(out).all()
    print(f"{path}: {cls} loads and runs: {tuple(out.shape)}")


PARTS = {"vae": vae_part, "vocoder": vocoder_part}


def main(argv):
    if argv and argv[0] == "--check":
        for path in argv[1:]:
            check(path)
        return
    out_dir = argv[0] if argv else "fixtures"
    torch.manual_seed(0)
    for part in argv[1:] or list(PARTS):
        PARTS[part](out_dir)


if __name__ == "__main__":
    main(sys.argv[1:])
