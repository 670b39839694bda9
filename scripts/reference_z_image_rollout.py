"""Reference trajectory for Z-Image: diffusers' ZImagePipeline components in a loop written here (prompt encoding with
the Qwen3 chat template, valid tokens per row, the pipeline's sigmas and timestep convention, CFG as the pipeline
combines it, the flow-GRPO SDE step inside a window, Euler outside), with given noise.

Usage (the project's reference venv):
    flowtune make-tiny z-image fixtures/z_image_pipeline
    python scripts/reference_z_image_rollout.py fixtures/z_image_pipeline fixtures/z_image_rollout_io.safetensors [flowtune]

The transformer predicts `-v` at `t = (1000 - timestep) / 1000`; the pipeline's CFG is `pos + g (pos - neg)`, which the
family's `combine_guidance` reproduces, so `flowtune debug rollout` runs with the same `--guidance` g. With a flowtune binary, it
also runs `flowtune debug rollout` on the same prompts and noise and prints the largest relative difference.
"""
import os
import subprocess
import sys
import tempfile

import torch
from diffusers import ZImagePipeline
from diffusers.pipelines.z_image.pipeline_z_image import calculate_shift, get_default_z_image_sigmas
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_qwen_rollout import sde_step  # noqa: E402

PROMPTS = ["a red circle next to a blue square", "一只猫坐在垫子上, \"OPEN\" 24/7, with a long caption that runs past "
           "thirty-two tokens of the template so the two rows pad to different lengths"]
SPEC = dict(steps=6, guidance_scale=3.0, noise_level=0.7, window_start=1, window_size=3, height=24, width=40)


def denoise(pipe, s, x, step_noise, positive, negative):
    """The reference loop: conditional and unconditional rows in one transformer call, as the pipeline batches them.
    Returns the final latents, `output.*` records and the sigmas."""
    b, _, h, w = x.shape
    n = s["steps"]
    c = pipe.scheduler.config
    mu = calculate_shift((h // 2) * (w // 2), c.get("base_image_seq_len", 256), c.get("max_image_seq_len", 4096),
                         c.get("base_shift", 0.5), c.get("max_shift", 1.15))
    pipe.scheduler.set_timesteps(sigmas=get_default_z_image_sigmas(n), mu=mu)
    sigmas, timesteps = pipe.scheduler.sigmas, pipe.scheduler.timesteps
    ws, wn = s["window_start"], s["window_size"]
    lat = x
    lats, lps, ts = [], [], []
    for i in range(n):
        t = timesteps[i].expand(b)
        t_in = ((1000 - t) / 1000).repeat(2)
        out = pipe.transformer(list(lat.repeat(2, 1, 1, 1).unsqueeze(2).unbind(0)), t_in, positive + negative,
                               return_dict=False)[0]
        pos, neg = torch.stack(out[:b]).squeeze(2), torch.stack(out[b:]).squeeze(2)
        v = -(pos + s["guidance_scale"] * (pos - neg))
        if i == ws:
            lats.append(lat)
        if ws <= i < ws + wn:
            lat, lp = sde_step(sigmas, i, lat, v, s["noise_level"], step_noise[i])
            lats.append(lat)
            lps.append(lp)
            ts.append(t.clone())
        else:
            lat = lat + v * (sigmas[i + 1] - sigmas[i])
    recorded = {
        "output.final_latents": lat,
        "output.all_latents": torch.stack(lats, dim=1),
        "output.all_log_probs": torch.stack(lps, dim=1),
        "output.all_timesteps": torch.stack(ts, dim=1),
    }
    return lat, recorded, sigmas


def padded(rows):
    """A list of (L_i, D) states as (B, L, D) zero-padded states and a (B, L) mask."""
    longest = max(len(r) for r in rows)
    embeds = torch.zeros(len(rows), longest, rows[0].shape[1])
    mask = torch.zeros(len(rows), longest, dtype=torch.int64)
    for i, r in enumerate(rows):
        embeds[i, : len(r)] = r
        mask[i, : len(r)] = 1
    return embeds, mask


def main(pipeline_dir, out, flowtune=None):
    pipe = ZImagePipeline.from_pretrained(pipeline_dir)
    s = SPEC
    b = len(PROMPTS)
    f = pipe.vae_scale_factor
    h, w = s["height"] // f, s["width"] // f
    c = pipe.transformer.config.in_channels
    g = torch.Generator().manual_seed(7)
    x = torch.randn(b, c, h, w, generator=g)
    step_noise = torch.randn(s["steps"], b, c, h, w, generator=g)
    io = {"input.initial_latents": x.clone(), "input.step_noise": step_noise}

    with torch.no_grad():
        pe, ne = pipe.encode_prompt(list(PROMPTS), device="cpu", negative_prompt=[""] * b, max_sequence_length=512)
        io["output.prompt_embeds"], io["output.prompt_mask"] = padded(pe)
        io["output.negative_prompt_embeds"], io["output.negative_prompt_mask"] = padded(ne)
        final, recorded, sigmas = denoise(pipe, s, x, step_noise, pe, ne)
        latents = final / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor
        image = pipe.vae.decode(latents, return_dict=False)[0]
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
