"""The PyTorch-eager anchor for `flowtune bench rollout`: the same pipeline, batch, steps and CFG in
diffusers' StableDiffusion3Pipeline (ODE sampling and VAE decode; flowtune's rollout also computes
SDE log-probs).

Usage (needs `pip install torch diffusers transformers`):
    python scripts/bench_rollout_diffusers.py DIR [--batch 4 --steps 10 --guidance 4.5 --resolution 512 --iters 3]
"""
import argparse
import time

import torch
from diffusers import StableDiffusion3Pipeline


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--guidance", type=float, default=4.5)
    ap.add_argument("--resolution", type=int, default=512)
    ap.add_argument("--iters", type=int, default=3)
    a = ap.parse_args()
    pipe = StableDiffusion3Pipeline.from_pretrained(a.dir)
    pipe.set_progress_bar_config(disable=True)
    prompts = ["a photo of a red circle next to a blue square"] * a.batch

    def run():
        with torch.no_grad():
            pipe(prompts, num_inference_steps=a.steps, guidance_scale=a.guidance, height=a.resolution, width=a.resolution, output_type="np")

    run()
    start = time.perf_counter()
    for _ in range(a.iters):
        run()
    seconds = (time.perf_counter() - start) / a.iters
    print(f"diffusers rollout: batch {a.batch} x {a.steps} steps at {a.resolution}px, CFG {a.guidance}: {seconds * 1e3:.1f} ms per batch, {a.batch / seconds:.2f} images/s")


if __name__ == "__main__":
    main()
