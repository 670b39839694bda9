"""The PyTorch-eager anchor for `flowtune bench rollout`: the same pipeline, batch, steps and CFG in
diffusers' pipeline of the directory (ODE sampling and VAE decode; Qwen-Image's CFG is its "true CFG" against the
negative prompt " "; Wan samples --num-frames frames; flowtune's rollout also computes SDE log-probs).

Usage (needs `pip install torch diffusers transformers`):
    python scripts/bench_rollout_diffusers.py DIR [--batch 4 --steps 10 --guidance 4.5 --resolution 512 --iters 3 --num-frames 81]
"""
import argparse
import time

import torch
from diffusers import DiffusionPipeline


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--guidance", type=float, default=4.5)
    ap.add_argument("--resolution", type=int, default=512)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--num-frames", type=int, default=81)
    a = ap.parse_args()
    pipe = DiffusionPipeline.from_pretrained(a.dir)
    pipe.set_progress_bar_config(disable=True)
    prompts = ["a photo of a red circle next to a blue square"] * a.batch

    def run():
        with torch.no_grad():
            if type(pipe).__name__ == "QwenImagePipeline":
                cfg = dict(true_cfg_scale=a.guidance, negative_prompt=[" "] * a.batch)
            elif type(pipe).__name__ == "WanPipeline":
                cfg = dict(guidance_scale=a.guidance, num_frames=a.num_frames)
            else:
                cfg = dict(guidance_scale=a.guidance)
            pipe(prompts, num_inference_steps=a.steps, height=a.resolution, width=a.resolution, output_type="np", **cfg)

    run()
    start = time.perf_counter()
    for _ in range(a.iters):
        run()
    seconds = (time.perf_counter() - start) / a.iters
    frames = f", {a.num_frames} frames" if type(pipe).__name__ == "WanPipeline" else ""
    print(f"diffusers rollout: batch {a.batch} x {a.steps} steps at {a.resolution}px{frames}, CFG {a.guidance}: {seconds * 1e3:.1f} ms per batch, {a.batch / seconds:.2f} samples/s")


if __name__ == "__main__":
    main()
