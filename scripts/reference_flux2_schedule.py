"""FLUX.2 sigma grids from diffusers, appended to `schedule.json` (pipeline `flux2`).

Usage: python scripts/reference_flux2_schedule.py fixtures

`Flux2KleinPipeline.__call__` (and `Flux2Pipeline`'s) passes `sigmas = np.linspace(1.0, 1 / N, N)` and
`mu = compute_empirical_mu(image_seq_len, N)` to `FlowMatchEulerDiscreteScheduler.set_timesteps`; the empirical μ
has two branches (token counts above 4300 ignore the step count).
"""
import json
import os
import sys

import numpy as np
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

# The released FLUX.2 scheduler config.
CONFIG = {"num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": True, "base_shift": 0.5,
          "max_shift": 1.15, "base_image_seq_len": 256, "max_image_seq_len": 4096, "time_shift_type": "exponential"}
CASES = [
    ("flux2-klein-4-1024px", 4, 4096),
    ("flux2-klein-50-512px", 50, 1024),
    ("flux2-28-256-tokens", 28, 256),
    ("flux2-10-5000-tokens", 10, 5000),
]


def case(name, steps, seq_len):
    s = FlowMatchEulerDiscreteScheduler(**CONFIG)
    mu = compute_empirical_mu(image_seq_len=seq_len, num_steps=steps)
    s.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    return {
        "name": name, "pipeline": "flux2", "steps": steps, "config": CONFIG, "image_seq_len": seq_len, "mu": mu,
        "sigmas": s.sigmas.tolist(), "timesteps": s.timesteps.tolist(),
    }


def main(out_dir):
    path = os.path.join(out_dir, "schedule.json")
    cases = [c for c in json.load(open(path)) if c.get("pipeline") != "flux2"]
    cases += [case(*c) for c in CASES]
    with open(path, "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fixtures")
