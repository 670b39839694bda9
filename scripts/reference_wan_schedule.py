"""Wan sigma grids from diffusers' UniPCMultistepScheduler, appended to `schedule.json` (pipeline `wan`).

Usage: python scripts/reference_wan_schedule.py fixtures

WanPipeline calls `scheduler.set_timesteps(N)` on a UniPC scheduler with `use_flow_sigmas` and a static
`flow_shift` (5 for Wan2.2-TI2V-5B and the 720p models, 3 for 480p), then feeds `scheduler.timesteps` (int64) to
the transformer. The cases record `scheduler.sigmas` (f32, final 0) and those integer timesteps.
"""
import json
import os
import sys

from diffusers import UniPCMultistepScheduler

BASE = {"num_train_timesteps": 1000, "prediction_type": "flow_prediction", "use_flow_sigmas": True,
        "final_sigmas_type": "zero", "solver_order": 2, "solver_type": "bh2"}

CASES = [
    ("wan-ti2v-shift5-50", 50, {**BASE, "flow_shift": 5.0}),
    ("wan-shift5-20", 20, {**BASE, "flow_shift": 5.0}),
    ("wan-480p-shift3-40", 40, {**BASE, "flow_shift": 3.0}),
    ("wan-shift5-4", 4, {**BASE, "flow_shift": 5.0}),
    ("wan-shift1-7", 7, {**BASE, "flow_shift": 1.0}),
    ("wan-shift8-13", 13, {**BASE, "flow_shift": 8.0}),
]


def case(name, steps, config):
    s = UniPCMultistepScheduler(**config)
    s.set_timesteps(steps)
    return {
        "name": name, "pipeline": "wan", "steps": steps, "config": {"_class_name": "UniPCMultistepScheduler", **config},
        "image_seq_len": None, "mu": None, "sigmas": s.sigmas.tolist(), "timesteps": s.timesteps.tolist(),
    }


def main(out_dir):
    path = os.path.join(out_dir, "schedule.json")
    cases = [c for c in json.load(open(path)) if c.get("pipeline") != "wan"]
    cases += [case(*c) for c in CASES]
    with open(path, "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fixtures")
