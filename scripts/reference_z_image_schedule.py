"""Z-Image sigma grids from diffusers, appended to `schedule.json` (pipeline `z_image`).

Usage: python scripts/reference_z_image_schedule.py fixtures

`ZImagePipeline.__call__` passes `sigmas = torch.linspace(1, 1/N, N).tolist()` (f32) and `mu` from the image token
count to `FlowMatchEulerDiscreteScheduler.set_timesteps`; mu only matters with dynamic shifting. Step counts where
torch's f32 linspace differs from numpy's are included.
"""
import json
import os
import sys

import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.z_image.pipeline_z_image import calculate_shift, get_default_z_image_sigmas

CASES = [
    ("z-image-turbo-8", 8, {"num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": False}, 4096),
    ("z-image-turbo-9", 9, {"num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": False}, 4096),
    ("z-image-shift6-50", 50, {"num_train_timesteps": 1000, "shift": 6.0, "use_dynamic_shifting": False}, 1024),
    ("z-image-dynamic-13", 13, {"num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": True}, 1024),
]


def case(name, steps, config, seq_len):
    s = FlowMatchEulerDiscreteScheduler(**config)
    mu = calculate_shift(seq_len, s.config.base_image_seq_len, s.config.max_image_seq_len, s.config.base_shift,
                         s.config.max_shift)
    s.set_timesteps(sigmas=get_default_z_image_sigmas(steps), mu=mu)
    return {
        "name": name, "pipeline": "z_image", "steps": steps, "config": config, "image_seq_len": seq_len,
        "mu": mu if config["use_dynamic_shifting"] else None,
        "sigmas": s.sigmas.tolist(), "timesteps": s.timesteps.tolist(),
    }


def main(out_dir):
    path = os.path.join(out_dir, "schedule.json")
    cases = [c for c in json.load(open(path)) if c.get("pipeline") != "z_image"]
    cases += [case(*c) for c in CASES]
    with open(path, "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fixtures")
