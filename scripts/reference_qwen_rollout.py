"""Reference trajectory for Qwen-Image: diffusers' QwenImagePipeline components in a loop written
here (prompt encoding with the chat template, packed latents, "true CFG" with per-token norm
rescale, the flow-GRPO SDE step inside a window, Euler outside), with given noise.

Usage (the project's reference venv):
    flowtune make-tiny qwen_image fixtures/qwen_image_pipeline
    python scripts/reference_qwen_rollout.py fixtures/qwen_image_pipeline fixtures/qwen_image_rollout_io.safetensors [flowtune]

Inputs and outputs are in flowtune's latent layout (B, 16, H/8, W/8); the loop itself runs on
diffusers' packed (B, (H/16)(W/16), 64) tokens. With a flowtune binary, it also runs
`flowtune debug rollout` on the same prompts and noise and prints the largest relative difference.
"""
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from diffusers import QwenImagePipeline
from safetensors.torch import load_file, save_file

PROMPTS = ["a red circle next to a blue square", "一只猫坐在垫子上, \"OPEN\" 24/7"]
SPEC = dict(steps=6, guidance_scale=4.0, noise_level=0.7, window_start=1, window_size=3, height=48, width=80)


def sde_step(sigmas, i, x, v, noise_level, noise):
    """flow-GRPO's SDE step from sigmas[i] to sigmas[i+1] and its log-density (mean over dims)."""
    sigma, sigma_prev, sigma_max = sigmas[i], sigmas[i + 1], sigmas[1]
    dt = sigma_prev - sigma
    std = torch.sqrt(sigma / (1 - (sigma_max if float(sigma) == 1.0 else sigma))) * noise_level
    mean = x * (1 + std**2 / (2 * sigma) * dt) + v * (1 + std**2 * (1 - sigma) / (2 * sigma)) * dt
    scale = std * torch.sqrt(-dt)
    prev = mean + scale * noise
    lp = -((prev - mean) ** 2) / (2 * scale**2) - torch.log(scale) - math.log(math.sqrt(2 * math.pi))
    return prev, lp.mean(dim=tuple(range(1, lp.ndim)))


def pack(x):
    b, c, h, w = x.shape
    return x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)


def unpack(x, h, w):
    b, _, c4 = x.shape
    return x.view(b, h // 2, w // 2, c4 // 4, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c4 // 4, h, w)


def denoise(pipe, s, x, step_noise, positive, negative, img_shapes, condition=None):
    """The reference loop on packed tokens: diffusers' dynamic-shift grid, true CFG with per-token
    norm rescale, the SDE step inside the window and Euler outside. `condition` (packed condition
    latents) rides on the image stream and is cropped from the prediction, as in the edit pipelines.
    Returns the final latents and `output.*` records in flowtune's layout, and the sigmas."""
    b, _, h, w = x.shape
    n = s["steps"]
    c = pipe.scheduler.config
    m = (c.max_shift - c.base_shift) / (c.max_image_seq_len - c.base_image_seq_len)
    mu = (h // 2) * (w // 2) * m + c.base_shift - m * c.base_image_seq_len
    pipe.scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / n, n).tolist(), mu=mu)
    sigmas, timesteps = pipe.scheduler.sigmas, pipe.scheduler.timesteps
    lat = pack(x)
    ws, wn = s["window_start"], s["window_size"]
    lats, lps, ts = [], [], []
    for i in range(n):
        t = timesteps[i].expand(b).to(lat.dtype)
        tokens = lat if condition is None else torch.cat([lat, condition], dim=1)
        call = dict(hidden_states=tokens, timestep=t / 1000, img_shapes=img_shapes, return_dict=False)
        (pe, pm), (ne, nm) = positive, negative
        v_pos = pipe.transformer(encoder_hidden_states=pe, encoder_hidden_states_mask=pm, **call)[0][:, : lat.size(1)]
        v_neg = pipe.transformer(encoder_hidden_states=ne, encoder_hidden_states_mask=nm, **call)[0][:, : lat.size(1)]
        comb = v_neg + s["guidance_scale"] * (v_pos - v_neg)
        v = comb * (torch.norm(v_pos, dim=-1, keepdim=True) / torch.norm(comb, dim=-1, keepdim=True))
        in_window = ws <= i < ws + wn
        if i == ws:
            lats.append(unpack(lat, h, w))
        if in_window:
            lat, lp = sde_step(sigmas, i, lat, v, s["noise_level"], pack(step_noise[i]))
            lats.append(unpack(lat, h, w))
            lps.append(lp)
            ts.append(t.clone())
        else:
            lat = lat + v * (sigmas[i + 1] - sigmas[i])
    final = unpack(lat, h, w)
    recorded = {
        "output.final_latents": final,
        "output.all_latents": torch.stack(lats, dim=1),
        "output.all_log_probs": torch.stack(lps, dim=1),
        "output.all_timesteps": torch.stack(ts, dim=1),
    }
    return final, recorded, sigmas


def main(pipeline_dir, out, flowtune=None):
    pipe = QwenImagePipeline.from_pretrained(pipeline_dir)
    s = SPEC
    b = len(PROMPTS)
    f = pipe.vae_scale_factor
    h, w = s["height"] // f, s["width"] // f
    g = torch.Generator().manual_seed(7)
    x = torch.randn(b, 16, h, w, generator=g)
    step_noise = torch.randn(s["steps"], b, 16, h, w, generator=g)
    io = {"input.initial_latents": x.clone(), "input.step_noise": step_noise}

    with torch.no_grad():
        pe, pm = pipe.encode_prompt(PROMPTS, device="cpu", max_sequence_length=512)
        ne, nm = pipe.encode_prompt([" "] * b, device="cpu", max_sequence_length=512)
        io["output.prompt_embeds"] = pe
        io["output.negative_prompt_embeds"] = ne
        img_shapes = [[(1, h // 2, w // 2)]] * b
        final, recorded, sigmas = denoise(pipe, s, x, step_noise, (pe, pm), (ne, nm), img_shapes)
        mean = torch.tensor(pipe.vae.config.latents_mean).view(1, 16, 1, 1, 1)
        std = torch.tensor(pipe.vae.config.latents_std).view(1, 16, 1, 1, 1)
        image = pipe.vae.decode(final.unsqueeze(2) * std + mean, return_dict=False)[0][:, :, 0]
    io.update(recorded)
    io["output.image"] = image
    save_file({k: v.contiguous() for k, v in io.items()}, out)
    print(f"wrote {out}: {s}, sigmas {[round(float(v), 4) for v in sigmas]}")

    if flowtune:
        with tempfile.TemporaryDirectory() as tmp:
            with open(f"{tmp}/prompts.txt", "w") as fh:
                fh.write("\n".join(PROMPTS) + "\n")
            save_file({"initial_latents": x, "step_noise": step_noise}, f"{tmp}/noise.safetensors")
            subprocess.run([flowtune, "debug", "rollout", "--model", pipeline_dir, "--prompts", f"{tmp}/prompts.txt",
                            "--noise", f"{tmp}/noise.safetensors", "--out", f"{tmp}/out.safetensors",
                            "--steps", str(s["steps"]), "--guidance", str(s["guidance_scale"]),
                            "--noise-level", str(s["noise_level"]),
                            "--window-start", str(s["window_start"]), "--window-size", str(s["window_size"])], check=True)
            ours = load_file(f"{tmp}/out.safetensors")
        worst = 0.0
        for k in ["all_latents", "all_log_probs", "all_timesteps", "final_latents"]:
            ref = io[f"output.{k}"]
            rel = ((ours[k] - ref).norm() / ref.norm()).item()
            worst = max(worst, rel)
            print(f"debug rollout {k}: relative difference {rel:.2e}")
        pixels = ((image.clamp(-1, 1) + 1) * 127.5).round().permute(0, 2, 3, 1).to(torch.uint8)
        off = (ours["images"].int() - pixels.int()).abs().max().item()
        print(f"debug rollout images: largest pixel difference {off}")
        sys.exit(0 if worst < 1e-3 and off <= 1 else 1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
