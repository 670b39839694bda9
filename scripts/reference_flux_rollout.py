"""Reference trajectory for FLUX.1: diffusers' FluxPipeline components in a loop written here
(CLIP pooled + T5 prompt encoding, packed latents with position ids, the distilled guidance of
[dev] through the guidance embedding and no CFG, the flow-GRPO SDE step inside a window, Euler
outside), with given noise.

Usage (the project's reference venv):
    flowtune make-tiny flux fixtures/flux_pipeline
    python scripts/reference_flux_rollout.py fixtures/flux_pipeline fixtures/flux_rollout_io.safetensors [flowtune]

Inputs and outputs are in flowtune's latent layout (B, 16, H/8, W/8); the loop itself runs on
diffusers' packed (B, (H/16)(W/16), 64) tokens. With a flowtune binary, it also runs
`flowtune debug rollout` on the same prompts and noise and prints the largest relative difference.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from diffusers import FluxPipeline
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from reference_qwen_rollout import pack, sde_step, unpack  # noqa: E402

PROMPTS = ["a red circle next to a blue square", "a cat sitting on a mat, \"OPEN\" 24/7"]
SPEC = dict(steps=6, embedded_guidance=2.5, noise_level=0.7, window_start=1, window_size=3, height=24, width=40,
            max_sequence_length=16)


def image_ids(rows, cols):
    ids = torch.zeros(rows, cols, 3)
    ids[..., 1] += torch.arange(rows)[:, None]
    ids[..., 2] += torch.arange(cols)[None, :]
    return ids.reshape(rows * cols, 3)


def main(pipeline_dir, out, flowtune=None):
    pipe = FluxPipeline.from_pretrained(pipeline_dir)
    s = SPEC
    b, n = len(PROMPTS), s["steps"]
    f = pipe.vae_scale_factor
    h, w = s["height"] // f, s["width"] // f
    g = torch.Generator().manual_seed(7)
    x = torch.randn(b, 16, h, w, generator=g)
    step_noise = torch.randn(n, b, 16, h, w, generator=g)
    io = {"input.initial_latents": x.clone(), "input.step_noise": step_noise}

    with torch.no_grad():
        embeds, pooled, text_ids = pipe.encode_prompt(PROMPTS, prompt_2=None, device="cpu",
                                                      max_sequence_length=s["max_sequence_length"])
        io["output.prompt_embeds"] = embeds
        io["output.pooled_prompt_embeds"] = pooled
        c = pipe.scheduler.config
        m = (c.max_shift - c.base_shift) / (c.max_image_seq_len - c.base_image_seq_len)
        mu = (h // 2) * (w // 2) * m + c.base_shift - m * c.base_image_seq_len
        pipe.scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / n, n).tolist(), mu=mu)
        sigmas, timesteps = pipe.scheduler.sigmas, pipe.scheduler.timesteps
        guidance = (torch.full([b], s["embedded_guidance"]) if pipe.transformer.config.guidance_embeds else None)
        img_ids = image_ids(h // 2, w // 2)
        lat = pack(x)
        ws, wn = s["window_start"], s["window_size"]
        lats, lps, ts = [], [], []
        for i in range(n):
            t = timesteps[i].expand(b).to(lat.dtype)
            v = pipe.transformer(hidden_states=lat, timestep=t / 1000, guidance=guidance, pooled_projections=pooled,
                                 encoder_hidden_states=embeds, txt_ids=text_ids, img_ids=img_ids,
                                 return_dict=False)[0]
            if i == ws:
                lats.append(unpack(lat, h, w))
            if ws <= i < ws + wn:
                lat, lp = sde_step(sigmas, i, lat, v, s["noise_level"], pack(step_noise[i]))
                lats.append(unpack(lat, h, w))
                lps.append(lp)
                ts.append(t.clone())
            else:
                lat = lat + v * (sigmas[i + 1] - sigmas[i])
        final = unpack(lat, h, w)
        z = final / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor
        image = pipe.vae.decode(z, return_dict=False)[0]
        # The VAE's encoder on the decoded pictures as u8 (offline DPO's path): posterior mean,
        # shifted and scaled into latents.
        pixels = ((image.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        posterior = pipe.vae.encode(pixels.float() / 127.5 - 1, return_dict=False)[0]
        encoded = (posterior.mean - pipe.vae.config.shift_factor) * pipe.vae.config.scaling_factor
    io.update({
        "output.final_latents": final,
        "output.all_latents": torch.stack(lats, dim=1),
        "output.all_log_probs": torch.stack(lps, dim=1),
        "output.all_timesteps": torch.stack(ts, dim=1),
        "output.image": image,
        "input.pixels": pixels.permute(0, 2, 3, 1).contiguous(),
        "output.encoded_latents": encoded,
    })
    save_file({k: v.contiguous() for k, v in io.items()}, out)
    print(f"wrote {out}: {s}, sigmas {[round(float(v), 4) for v in sigmas]}")

    if flowtune:
        with tempfile.TemporaryDirectory() as tmp:
            with open(f"{tmp}/prompts.txt", "w") as fh:
                fh.write("\n".join(PROMPTS) + "\n")
            save_file({"initial_latents": x, "step_noise": step_noise}, f"{tmp}/noise.safetensors")
            subprocess.run([flowtune, "debug", "rollout", "--model", pipeline_dir, "--prompts", f"{tmp}/prompts.txt",
                            "--noise", f"{tmp}/noise.safetensors", "--out", f"{tmp}/out.safetensors",
                            "--steps", str(n), "--guidance", "1", "--embedded-guidance", str(s["embedded_guidance"]),
                            "--max-sequence-length", str(s["max_sequence_length"]),
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
