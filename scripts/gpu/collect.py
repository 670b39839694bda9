"""Gathers the GPU suite's parts (scripts/gpu/suite.sh) into docs/perf/gpu/<date>-<gpu>.json, one
Markdown row per part (<date>-<gpu>.md) and the parts' whole logs (<date>-<gpu>.log, not committed).
Standard library only.

Usage: python scripts/gpu/collect.py PARTS_DIR --out DIR [--tiny 0|1]
"""
import argparse
import datetime
import json
import os
import re


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def load(parts, name):
    text = read(os.path.join(parts, name))
    return json.loads(text) if text else None


def part(parts, key):
    status = (read(os.path.join(parts, f"{key}.status")) or "not run").strip()
    seconds = read(os.path.join(parts, f"{key}.seconds"))
    log = read(os.path.join(parts, f"{key}.log")) or ""
    return {"status": status, "seconds": int(seconds) if seconds else None,
            "log_tail": log.strip().splitlines()[-8:]}, log


def parity_cases(log):
    """The `case NAME DTYPE TOL` lines and the relative errors printed after each."""
    cases, current = [], None
    for line in log.splitlines():
        if line.startswith("case "):
            current = {"case": line[5:].strip(), "error": None, "ok": None}
            cases.append(current)
        elif current is not None:
            m = re.match(r"output\.\S+: relative error (\S+) \(tolerance (\S+)\) (\S+)", line)
            if m:
                current.update(error=float(m.group(1)), tolerance=float(m.group(2)), ok=m.group(3) == "ok")
            elif line.startswith("trained "):
                current["ok"] = True
    return cases


def ratios(step, rollout, train):
    """flowtune over diffusers on the same shapes: rollout (denoising + decode of the step's samples)
    and one LoRA forward + backward of a training micro-batch."""
    out = {}
    if step and rollout and step.get("seconds", {}).get("gen"):
        theirs = rollout["seconds_per_batch"] + (rollout.get("decode_seconds") or 0.0)
        out["rollout_speedup_vs_diffusers"] = theirs / step["seconds"]["gen"]
    shape = (step or {}).get("shape") or {}
    if step and train and shape.get("micro_steps") and step["seconds"].get("update_actor"):
        ours = step["seconds"]["update_actor"] / shape["micro_steps"]
        out["update_speedup_vs_diffusers"] = train["seconds_per_step"] / ours
    return out


def fmt(x, pattern="{:.3g}"):
    return "–" if x is None else pattern.format(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("parts")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", type=int, default=0)
    a = ap.parse_args()
    result = {"date": datetime.date.today().isoformat(), "tiny": bool(a.tiny), "parts": {}}
    p = result["parts"]
    p["a"], env_log = part(a.parts, "a")
    m = re.search(r"cuda:0: ([^,]+),", env_log)
    result["gpu"] = m.group(1).strip() if m else "cpu"
    p["b"], log = part(a.parts, "b")
    p["b"]["cases"] = parity_cases(log)
    p["c"], _ = part(a.parts, "c")
    p["c"]["qwen_image"] = load(a.parts, "c.json")
    p["d"], _ = part(a.parts, "d")
    p["d"]["rollout"], p["d"]["train"] = load(a.parts, "d_rollout.json"), load(a.parts, "d_train.json")
    p["d"].update(ratios(p["c"]["qwen_image"], p["d"]["rollout"], p["d"]["train"]))
    p["e"], _ = part(a.parts, "e")
    p["e"]["constants"] = load(a.parts, "e.json")
    p["f"], _ = part(a.parts, "f")
    p["f"]["wan"], p["f"]["flux2"] = load(a.parts, "f_wan.json"), load(a.parts, "f_flux2.json")
    p["g"], _ = part(a.parts, "g")
    p["g"]["qwen_image"] = load(a.parts, "g.json")
    p["h"], _ = part(a.parts, "h")
    p["h"]["ltx2"] = load(a.parts, "h.json")
    p["i"], _ = part(a.parts, "i")
    p["i"]["reward_overlap"] = (load(a.parts, "i.json") or {}).get("reward_overlap")
    on, off = p["c"]["qwen_image"], p["g"]["qwen_image"]
    if on and off and off["images_per_s_per_gpu"]:
        p["g"]["items_speedup"] = on["images_per_s_per_gpu"] / off["images_per_s_per_gpu"]

    gpu = result["gpu"]
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-").lower() + ("-tiny" if a.tiny else "")
    stem = os.path.join(a.out, f"{result['date']}-{slug}")
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")

    def step_row(s):
        if not s:
            return "no result"
        mem = s["memory_gib"]
        return (f"set up {fmt(s.get('setup_seconds'), '{:.0f}')} s, {fmt(s['images_per_s_per_gpu'])} images/s/GPU, step {fmt(s['seconds'].get('step'), '{:.1f}')} s, "
                f"MFU rollout {fmt(s['mfu']['rollout'], '{:.1%}')} update {fmt(s['mfu']['update'], '{:.1%}')}, "
                f"memory {fmt(mem['measured'], '{:.1f}')} GiB vs plan {fmt(mem['planned'], '{:.1f}')} GiB")

    def overlap_row(o):
        if not o:
            return "no result"
        return (f"sampling {fmt(o['sampling_s'], '{:.2f}')} s, scoring {fmt(o['scoring_s'], '{:.2f}')} s: "
                f"rollout phase {fmt(o['overlapped']['rollout_s'], '{:.2f}')} s overlapped vs "
                f"{fmt(o['serial']['rollout_s'], '{:.2f}')} s serial, {fmt(o['hidden_fraction'], '{:.0%}')} of the scoring hidden, "
                f"scores {'identical' if o['rewards_identical'] else 'different'} in both orders")

    cases = p["b"]["cases"]
    rows = [
        ("a env", p["a"], gpu),
        ("b parity", p["b"], ", ".join(f"{c['case'].split(' ')[0]} {c['case'].split(' ')[1] if ' ' in c['case'] else ''} "
                                         f"{fmt(c['error'], '{:.1e}')}" for c in cases if c["error"] is not None)
         + ("; launch ok" if any(c["case"].startswith("launch") and c["ok"] for c in cases) else "")),
        ("c Qwen-Image step", p["c"], step_row(p["c"]["qwen_image"])),
        ("d diffusers anchors", p["d"],
         f"rollout ×{fmt(p['d'].get('rollout_speedup_vs_diffusers'), '{:.2f}')}, "
         f"LoRA update ×{fmt(p['d'].get('update_speedup_vs_diffusers'), '{:.2f}')} (flowtune over diffusers)"),
        ("e activation constants", p["e"], "measured" if p["e"]["constants"] else "no result"),
        ("f Wan2.2-5B / FLUX.2 [klein]", p["f"], f"{step_row(p['f']['wan'])}; {step_row(p['f']['flux2'])}"),
        ("g Qwen-Image step, throughput items off", p["g"],
         f"{step_row(p['g']['qwen_image'])}; items on (c) ×{fmt(p['g'].get('items_speedup'), '{:.2f}')}"),
        ("h LTX-2.3 with sound", p["h"], step_row(p["h"]["ltx2"])),
        ("i rewards beside sampling", p["i"], overlap_row(p["i"]["reward_overlap"])),
    ]
    with open(stem + ".log", "w") as f:
        for key in "abcdefghi":
            f.write(f"==== part {key}\n{read(os.path.join(a.parts, f'{key}.log')) or ''}\n")
    with open(stem + ".md", "w") as f:
        f.write("| date | GPU | part | status | figures |\n|---|---|---|---|---|\n")
        for name, info, figures in rows:
            f.write(f"| {result['date']} | {gpu} | {name} | {info['status']} ({fmt(info['seconds'], '{} s')}) | {figures} |\n")
    print(open(stem + ".md").read())
    print(f"wrote {stem}.json, {stem}.md and {stem}.log")


if __name__ == "__main__":
    main()
