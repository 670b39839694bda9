#!/usr/bin/env python3
"""Checks that every real-size recipe (examples/*.yaml but *_tiny.yaml) fits the hardware its
header names (`# Hardware: N × 80 GB GPUs`) by `flowtune plan`, with headroom: the plan's device
total and loading peak, times 1.2, must stay within the planner's budget (90 % of the GPU's
memory), since measured peaks have run up to ~20 % above the plan.

Real recipes name Hub ids (or `../models/<Name>` folders) that are not shipped; they are planned
against the config-only copies under examples/models/ (the teachers of on-policy distillation too, and the
in-process judges, through a temporary Hugging Face cache).

Usage: scripts/size_recipes.py [--bin target/release/flowtune] [--margin 1.2] [--gpus N]
                               [--set key=value ...] [--suggest] [--json] [recipe.yaml ...]
--suggest also prints the planner's changes for the headroom budget (the plan run at
--gpu-memory 80 / margin) for recipes that do not fit. Exit status 1 if any recipe does not fit
(or has no Hardware line).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# model.path of the real recipes → the config-only pipeline planned in its place.
MODELS = {
    "black-forest-labs/FLUX.1-dev": "examples/models/flux.1-dev",
    "black-forest-labs/FLUX.2-dev": "examples/models/flux.2-dev",
    "black-forest-labs/FLUX.2-klein-base-4B": "examples/models/flux.2-klein-base-4b",
    "Qwen/Qwen-Image": "examples/models/qwen-image",
    "../models/Qwen-Image-2.1": "examples/models/qwen-image-2.1",
    "stabilityai/stable-diffusion-3.5-medium": "examples/models/sd3.5-medium",
    "stabilityai/stable-diffusion-3.5-large": "examples/models/sd3.5-large",
    "Wan-AI/Wan2.2-TI2V-5B-Diffusers": "examples/models/wan2.2-ti2v-5b",
    "Wan-AI/Wan2.2-T2V-A14B-Diffusers": "examples/models/wan2.2-t2v-a14b",
    "dg845/LTX-2.3-Diffusers": "examples/models/ltx-2.3",
    "Lightricks/LTX-2": "examples/models/ltx-2",
    # Z-Image (base) has Z-Image-Turbo's architecture.
    "Tongyi-MAI/Z-Image": "examples/models/z-image-turbo",
    # Distillation teachers: the student's pipeline with merged weights.
    "../models/qwen-image-ocr-teacher": "examples/models/qwen-image",
    "../models/sd35m-ocr-teacher": "examples/models/sd3.5-medium",
}

# In-process judges (`vlm.backend: native`) by Hub id → their config-only copies, laid out as a Hugging Face cache
# for the planner.
JUDGES = {
    "Qwen/Qwen2.5-VL-7B-Instruct": "examples/models/judges/qwen2.5-vl-7b-instruct",
    "Qwen/Qwen3-VL-8B-Instruct": "examples/models/judges/qwen3-vl-8b-instruct",
    "Qwen/Qwen3-VL-4B-Instruct": "examples/models/judges/qwen3-vl-4b-instruct",
}

HARDWARE = re.compile(r"^# Hardware: (\d+) × (\d+) GB GPUs?$", re.M)


def recipes(args):
    if args.recipes:
        return [Path(r) for r in args.recipes]
    return sorted(p for p in (ROOT / "examples").glob("*.yaml") if not p.name.endswith("_tiny.yaml"))


def overrides(text):
    out = []
    path = re.search(r"^  path: (\S+)", text, re.M)
    if path and path.group(1) in MODELS:
        out.append(f"model.path={MODELS[path.group(1)]}")
    teacher = re.search(r"^  teacher_path: (\S+)", text, re.M)
    if teacher and teacher.group(1) in MODELS:
        out.append(f"model.teacher_path={MODELS[teacher.group(1)]}")
    return out


def judge_cache(folder):
    """A Hugging Face cache in `folder` holding the judges' configs."""
    for hub_id, configs in JUDGES.items():
        repo = Path(folder) / f"models--{hub_id.replace('/', '--')}"
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs/main").write_text("config-only")
        snapshot = repo / "snapshots/config-only"
        snapshot.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / configs / "config.json", snapshot / "config.json")
    return folder


def plan(binary, recipe, extra, gpus, gib, cache):
    cmd = [binary, "plan", str(recipe), *extra, "--gpus", str(gpus), "--gpu-memory", str(gib), "--json"]
    env = dict(os.environ, HF_HUB_CACHE=cache)
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipes", nargs="*")
    ap.add_argument("--bin", default=str(ROOT / "target/release/flowtune"))
    ap.add_argument("--margin", type=float, default=1.2)
    ap.add_argument("--gpus", type=int, help="plan on this many GPUs instead of the header's")
    ap.add_argument("--suggest", action="store_true")
    ap.add_argument("--json", action="store_true", help="one JSON object per recipe")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override for every recipe (repeatable)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        sys.exit(check(args, judge_cache(cache)))


def check(args, cache):
    """Plans every recipe; the number that do not fit (or cannot be planned)."""
    bad = 0
    for recipe in recipes(args):
        text = recipe.read_text()
        hw = HARDWARE.search(text)
        gpus, gib = (int(hw.group(1)), float(hw.group(2))) if hw else (None, 80.0)
        if args.gpus:
            gpus = args.gpus
        if gpus is None:
            print(f"{recipe.name}: no '# Hardware: N × 80 GB GPUs' line", file=sys.stderr)
            bad += 1
            continue
        extra = overrides(text) + args.set
        try:
            p = plan(args.bin, recipe, extra, gpus, gib, cache)
        except RuntimeError as e:
            print(e, file=sys.stderr)
            bad += 1
            continue
        dev, load, budget = p["device_gib"], p["load_gib"], p["budget_gib"]
        ok = max(dev, load) * args.margin <= budget
        bad += not ok
        row = {"recipe": recipe.name, "gpus": gpus, "gpu_gb": gib, "device_gib": round(dev, 1),
               "load_gib": round(load, 1), "host_gib": round(p["host_gib"], 1),
               "fits_with_margin": ok}
        if args.suggest and not ok:
            q = plan(args.bin, recipe, extra, gpus, gib / args.margin, cache)
            row["changes"] = q["changes"]
            row["changed_gib"] = q["changed_gib"]
        if args.json:
            print(json.dumps(row))
        else:
            mark = "ok " if ok else "BAD"
            more = f"  → {' '.join(row['changes'])} ({row['changed_gib'] or 0:.1f})" if "changes" in row else ""
            print(f"{mark} {recipe.name:<36} {gpus}×{gib:.0f}  device {dev:6.1f}  load {load:6.1f}"
                  f"  host {p['host_gib']:6.1f}{more}")
    return 1 if bad else 0


if __name__ == "__main__":
    main()
