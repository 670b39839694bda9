"""The README's performance table, made from the GPU suite's results (docs/perf/gpu/*.json, tiny runs
left out), with the reference's published figures beside them. Rewrites the lines between
`<!-- perf-table -->` and `<!-- /perf-table -->` in README.md (or prints them with --print).

Usage: python scripts/gpu/table.py [--print]
"""
import argparse
import glob
import json
import os

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
START, END = "<!-- perf-table -->", "<!-- /perf-table -->"
# VeRL-Omni docs/algo/performance.md: Qwen-Image OCR at 512², 10 steps, 32 × 16 images per step.
REFERENCE = [
    "| VeRL-Omni (published) | 4×H800 | FlowGRPO LoRA r64, true CFG 4, SDE window 2 | 0.305 | ≈ 17 % (step) | – | – | – | – |",
    "| VeRL-Omni (published) | 4×H200 | FlowGRPO full fine-tuning, no CFG | 0.510 | – | – | – | – | – |",
]


def pct(x):
    return "–" if x is None else f"{100 * x:.1f} %"


def num(x, pattern="{:.3g}"):
    return "–" if x is None else pattern.format(x)


def rows():
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "perf", "gpu", "*.json"))):
        with open(path) as f:
            r = json.load(f)
        if r.get("tiny"):
            continue
        step = (r["parts"].get("c") or {}).get("qwen_image")
        if not step:
            continue
        d, shape, mem = r["parts"].get("d") or {}, step.get("shape") or {}, step["memory_gib"]
        items = [k.replace("_", " ") for k, on in (step.get("throughput_items") or {}).items() if on]
        gain = (r["parts"].get("g") or {}).get("items_speedup")
        what = (f"flowtune FlowGRPO LoRA r64, true CFG 4, SDE window {shape.get('window_steps', '?')}, "
                f"{shape.get('samples_per_rank', '?')} images/step, random weights ({r['date']}); "
                f"items on: {', '.join(items) or 'none'}" + (f" (×{gain:.2f} over off)" if gain else ""))
        out.append(
            f"| flowtune | 1×{r['gpu']} | {what} | {num(step['images_per_s_per_gpu'])} "
            f"| {pct(step['mfu']['step'])} (step) | {pct(step['mfu']['rollout'])} / {pct(step['mfu']['update'])} "
            f"| {num(mem['measured'], '{:.1f}')} / {num(mem['planned'], '{:.1f}')} "
            f"| ×{num(d.get('rollout_speedup_vs_diffusers'), '{:.2f}')} | ×{num(d.get('update_speedup_vs_diffusers'), '{:.2f}')} |")
    return out


def table():
    head = ["| who | GPUs | Qwen-Image 20B at 512², OCR recipe | images/s/GPU | MFU | MFU rollout / update "
            "| peak GiB / plan | rollout vs diffusers | LoRA update vs diffusers |",
            "|---|---|---|---|---|---|---|---|---|"]
    body = rows() or ["| flowtune | – | not measured on a GPU yet (`scripts/gpu/suite.sh`) | – | – | – | – | – | – |"]
    return "\n".join(head + body + REFERENCE)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--print", action="store_true")
    a = ap.parse_args()
    text = table()
    if a.print:
        print(text)
        return
    readme = os.path.join(ROOT, "README.md")
    with open(readme) as f:
        content = f.read()
    before, rest = content.split(START, 1)
    _, after = rest.split(END, 1)
    with open(readme, "w") as f:
        f.write(f"{before}{START}\n{text}\n{END}{after}")
    print(f"README.md: {len(text.splitlines()) - 2} rows")


if __name__ == "__main__":
    main()
