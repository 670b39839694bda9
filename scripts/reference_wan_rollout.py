"""Reference trajectories for Wan text-to-video: diffusers' WanPipeline components in a loop written here (UMT5
prompt embeds zeroed past each prompt up to 512 tokens, the UniPC flow-sigma grid and its integer timesteps, per-token
timesteps where the pipeline has `expand_timesteps`, CFG as two forwards `u + g (c - u)`, the flow-GRPO SDE step inside
a window and Euler outside, with given noise), then the VAE decode of the final latents.

Usage (the project's reference venv):
    flowtune make-tiny wan fixtures/wan_pipeline
    python scripts/reference_wan_rollout.py fixtures/wan_pipeline fixtures [flowtune]
    python scripts/reference_wan_rollout.py --i2v fixtures/wan_pipeline fixtures [flowtune]

Writes `wan_rollout_f{frames}_io.safetensors` for each case of CASES (pixel frames, height, width). For a two-expert
pipeline (`flowtune make-tiny wan --a14b`: `transformer_2` and `boundary_ratio`, Wan2.2-T2V-A14B), each step runs the
expert WanPipeline picks for its timestep with that stage's CFG scale (SPEC_A14B's `guidance_scale_2` below the
boundary), for A14B_CASES into `wan_a14b_rollout_f{frames}_io.safetensors`. The window starts
at step 1: the grid's first sigma is 1 - 1e-6, where the flow-GRPO SDE's std sqrt(sigma / (1 - sigma)) is ~1000 eta.
With a flowtune binary, it also runs `flowtune debug rollout` on the same prompts and noise for every case and
prints the largest relative difference.

With --i2v (a pipeline with `expand_timesteps`, Wan2.2-TI2V-5B), the cases of I2V_CASES are image-to-video as
WanImageToVideoPipeline does it: the picture through its video processor (Pillow Lanczos to the sample size, [-1, 1])
and its `prepare_latents` (a one-frame clip encoded, the posterior mode normalised: `condition`, and the first-frame
mask); every model input holds the first latent frame at the condition with per-token timesteps 0 there. The first
frame is no sampled transition: the SDE step and its log-density (mean) run over the other frames, the first stays the
condition in every recorded latent, and the final latents are `(1 - mask) * condition + mask * latents` as the pipeline
decodes them. Writes `wan_i2v_rollout_f{frames}_io.safetensors` with `input.picture` (u8 H x W x 3) and
`output.condition`.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from diffusers import WanImageToVideoPipeline, WanPipeline
from PIL import Image
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_qwen_rollout import sde_step  # noqa: E402

PROMPTS = ["a red fox runs  through fresh snow", "a time-lapse of clouds over a mountain lake at dawn, with "
           "birds crossing the frame from left to right"]
SPEC = dict(steps=6, guidance_scale=4.0, noise_level=0.7, window_start=1, window_size=3)
# (pixel frames, height, width): one frame, and two clips of non-square sizes.
CASES = [(1, 32, 32), (5, 32, 64), (9, 64, 32)]
# Two experts: timesteps 999, 961, 909 (high noise) and 833, 714, 501 (low noise) with flow_shift 5; the window's
# steps 1-3 lie on both sides of the boundary 875.
SPEC_A14B = dict(SPEC, guidance_scale_2=3.0)
A14B_CASES = [(5, 32, 64)]
# Image-to-video (pixel frames, height, width): the picture is 40 x 24 pixels, resized to each sample's size.
I2V_CASES = [(5, 32, 64), (9, 64, 32)]


def test_picture():
    """A 24 x 40 (H x W) picture with a gradient, a disc and a bar, so resizing and encoding see real structure."""
    yy, xx = np.mgrid[0:24, 0:40]
    r = (xx * 6) % 256
    g = (yy * 10) % 256
    b = np.where((xx - 14) ** 2 + (yy - 12) ** 2 < 49, 230, 30)
    b = np.where((xx > 28) & (xx < 34), 120, b)
    return Image.fromarray(np.stack([r, g, b], axis=-1).astype(np.uint8))


def expert(pipe, s, t):
    """WanPipeline's stage of timestep `t`: `transformer` and `guidance_scale` at t >= boundary_ratio *
    num_train_timesteps (or without a boundary), else `transformer_2` and `guidance_scale_2`."""
    ratio = pipe.config.boundary_ratio
    if ratio is None or t >= ratio * pipe.scheduler.config.num_train_timesteps:
        return pipe.transformer, s["guidance_scale"]
    return pipe.transformer_2, s["guidance_scale_2"]


def timesteps_for(pipe, t, lat):
    """The transformer's timestep input: (B,) or, with `expand_timesteps`, one per token of a ones mask."""
    b, _, f, h, w = lat.shape
    if pipe.config.expand_timesteps:
        p = pipe.transformer.config.patch_size
        mask = torch.ones(1, 1, f, h, w)
        return (mask[0][0][:, :: p[1], :: p[2]] * t).flatten().unsqueeze(0).expand(b, -1)
    return t.expand(b)


def denoise(pipe, s, x, step_noise, positive, negative):
    """Returns the final latents, `output.*` records and the sigmas."""
    b = x.shape[0]
    n = s["steps"]
    pipe.scheduler.set_timesteps(n)
    sigmas, timesteps = pipe.scheduler.sigmas, pipe.scheduler.timesteps
    ws, wn = s["window_start"], s["window_size"]
    lat = x
    lats, lps, ts = [], [], []
    for i in range(n):
        t = timesteps_for(pipe, timesteps[i], lat)
        model, scale = expert(pipe, s, timesteps[i])
        cond = model(hidden_states=lat, timestep=t, encoder_hidden_states=positive, return_dict=False)[0]
        uncond = model(hidden_states=lat, timestep=t, encoder_hidden_states=negative, return_dict=False)[0]
        v = uncond + scale * (cond - uncond)
        if i == ws:
            lats.append(lat)
        if ws <= i < ws + wn:
            lat, lp = sde_step(sigmas, i, lat, v, s["noise_level"], step_noise[i])
            lats.append(lat)
            lps.append(lp)
            ts.append(timesteps[i].float().expand(b))
        else:
            lat = lat + v * (sigmas[i + 1] - sigmas[i])
    recorded = {
        "output.final_latents": lat,
        "output.all_latents": torch.stack(lats, dim=1),
        "output.all_log_probs": torch.stack(lps, dim=1),
        "output.all_timesteps": torch.stack(ts, dim=1),
    }
    return lat, recorded, sigmas


def denoise_i2v(pipe, s, x, step_noise, positive, negative, condition, mask):
    """The image-to-video loop: as `denoise`, with the first latent frame held at `condition`."""
    b = x.shape[0]
    n = s["steps"]
    pipe.scheduler.set_timesteps(n)
    sigmas, timesteps = pipe.scheduler.sigmas, pipe.scheduler.timesteps
    ws, wn = s["window_start"], s["window_size"]
    p = pipe.transformer.config.patch_size
    held = lambda lat: (1 - mask) * condition + mask * lat  # noqa: E731
    lat = held(x)
    lats, lps, ts = [], [], []
    for i in range(n):
        t = (mask[0][0][:, :: p[1], :: p[2]] * timesteps[i]).flatten().unsqueeze(0).expand(b, -1)
        inp = held(lat)
        cond = pipe.transformer(hidden_states=inp, timestep=t, encoder_hidden_states=positive, return_dict=False)[0]
        uncond = pipe.transformer(hidden_states=inp, timestep=t, encoder_hidden_states=negative, return_dict=False)[0]
        v = uncond + s["guidance_scale"] * (cond - uncond)
        if i == ws:
            lats.append(lat)
        if ws <= i < ws + wn:
            gen, lp = sde_step(sigmas, i, lat[:, :, 1:], v[:, :, 1:], s["noise_level"], step_noise[i][:, :, 1:])
            lat = torch.cat([condition, gen], dim=2)
            lats.append(lat)
            lps.append(lp)
            ts.append(timesteps[i].float().expand(b))
        else:
            lat = held(lat + v * (sigmas[i + 1] - sigmas[i]))
    recorded = {
        "output.final_latents": lat,
        "output.all_latents": torch.stack(lats, dim=1),
        "output.all_log_probs": torch.stack(lps, dim=1),
        "output.all_timesteps": torch.stack(ts, dim=1),
    }
    return lat, recorded, sigmas


def decode(pipe, latents):
    """WanPipeline's decode: `latents / (1 / std) + mean`, then the VAE; (B, 3, T, H, W) in [-1, 1]."""
    c = pipe.vae.config
    mean = torch.tensor(c.latents_mean).view(1, c.z_dim, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(c.latents_std).view(1, c.z_dim, 1, 1, 1)
    return pipe.vae.decode(latents / inv_std + mean, return_dict=False)[0]


def run_case(pipe, pipeline_dir, frames, height, width, out_dir, flowtune, picture=None):
    two = pipe.transformer_2 is not None
    s = SPEC_A14B if two else SPEC
    b = len(PROMPTS)
    sf, tf = pipe.vae_scale_factor_spatial, pipe.vae_scale_factor_temporal
    shape = (b, pipe.transformer.config.in_channels, (frames - 1) // tf + 1, height // sf, width // sf)
    g = torch.Generator().manual_seed(7 + frames)
    x = torch.randn(*shape, generator=g)
    step_noise = torch.randn(s["steps"], *shape, generator=g)
    io = {"input.initial_latents": x.clone(), "input.step_noise": step_noise}
    with torch.no_grad():
        pe, ne = pipe.encode_prompt(list(PROMPTS), negative_prompt=[""] * b, do_classifier_free_guidance=True,
                                    max_sequence_length=512, device="cpu")
        io["output.prompt_embeds"], io["output.negative_prompt_embeds"] = pe, ne
        if picture is None:
            final, recorded, sigmas = denoise(pipe, s, x, step_noise, pe, ne)
        else:
            image = pipe.video_processor.preprocess(picture, height=height, width=width).to(torch.float32)
            _, condition, mask = pipe.prepare_latents(image, b, shape[1], height, width, frames, torch.float32,
                                                      "cpu", None, x.clone())
            io["input.picture"] = torch.from_numpy(np.array(picture))
            io["output.condition"] = condition
            final, recorded, sigmas = denoise_i2v(pipe, s, x, step_noise, pe, ne, condition, mask)
        video = decode(pipe, final)
    io.update(recorded)
    io["output.video"] = video
    kind = "a14b_" if two else "i2v_" if picture is not None else ""
    out = os.path.join(out_dir, f"wan_{kind}rollout_f{frames}_io.safetensors")
    save_file({k: v.contiguous() for k, v in io.items()}, out)
    print(f"wrote {out}: {frames} frames {height}x{width}, latents {list(shape)}, video {list(video.shape)}, "
          f"sigmas {[round(float(v), 6) for v in sigmas]}")
    if not flowtune:
        return True
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/prompts.txt", "w") as fh:
            fh.write("\n".join(PROMPTS) + "\n")
        save_file({"initial_latents": x, "step_noise": step_noise}, f"{tmp}/noise.safetensors")
        images = []
        if picture is not None:
            picture.save(f"{tmp}/first.png")
            images = ["--images", f"{tmp}/first.png"]
        subprocess.run([flowtune, "debug", "rollout", "--model", pipeline_dir, "--prompts",
                        f"{tmp}/prompts.txt", "--noise", f"{tmp}/noise.safetensors", "--out", f"{tmp}/out.safetensors",
                        "--steps", str(s["steps"]), "--guidance", str(s["guidance_scale"]),
                        "--noise-level", str(s["noise_level"]), "--num-frames", str(frames),
                        "--window-start", str(s["window_start"]), "--window-size", str(s["window_size"]),
                        "--max-sequence-length", "512"]
                       + (["--guidance-2", str(s["guidance_scale_2"])] if two else []) + images, check=True)
        ours = load_file(f"{tmp}/out.safetensors")
    worst = 0.0
    for k in ["all_latents", "all_log_probs", "all_timesteps", "final_latents"]:
        ref = io[f"output.{k}"]
        rel = ((ours[k] - ref).norm() / ref.norm()).item()
        worst = max(worst, rel)
        print(f"  debug rollout {k}: relative difference {rel:.2e}")
    bb, c, t, h, w = video.shape
    pixels = ((video.clamp(-1, 1) + 1) * 127.5).round().permute(0, 3, 2, 4, 1).reshape(bb, h, t * w, c).to(torch.uint8)
    off = (ours["images"].int() - pixels.int()).abs().max().item()
    print(f"  debug rollout images {list(ours['images'].shape)}: largest pixel difference {off}")
    return worst < 1e-3 and off <= 1


def main(pipeline_dir, out_dir, flowtune=None, i2v=False):
    if i2v:
        pipe = WanImageToVideoPipeline.from_pretrained(pipeline_dir)
        assert pipe.config.expand_timesteps, "image-to-video here is Wan2.2-TI2V's (expand_timesteps)"
        ok = all([run_case(pipe, pipeline_dir, *case, out_dir, flowtune, test_picture()) for case in I2V_CASES])
        sys.exit(0 if ok else 1)
    pipe = WanPipeline.from_pretrained(pipeline_dir)
    cases = A14B_CASES if pipe.transformer_2 is not None else CASES
    ok = all([run_case(pipe, pipeline_dir, *case, out_dir, flowtune) for case in cases])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--i2v"]
    main(*args[:3], i2v="--i2v" in sys.argv[1:])
