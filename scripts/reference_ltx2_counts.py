"""Exact parameter counts of the LTX-2 config-only folders (examples/models/ltx-2, ltx-2.3), built
on the meta device with diffusers / transformers: the references of crates/plan/tests/counts.rs.

    PYTHONPATH=$HOME/.cache/flowtune/anchors $FLOWTUNE_VENV/bin/python scripts/reference_ltx2_counts.py \
        [--depth 2]

Prints each component's total and, with --depth, the parameters under each module prefix."""

import argparse
import collections
import json
import pathlib

import torch
from accelerate import init_empty_weights

ROOT = pathlib.Path(__file__).resolve().parent.parent / "examples" / "models"


def build(folder: pathlib.Path, name: str):
    cfg = json.loads((folder / name / "config.json").read_text())
    cls = cfg.get("_class_name") or cfg["architectures"][0]
    with init_empty_weights():
        if name == "text_encoder":
            import transformers

            config = transformers.AutoConfig.from_pretrained(folder / name)
            return getattr(transformers, cls)(config)
        if name in ("connectors", "vocoder"):
            import diffusers.pipelines.ltx2 as ltx2

            return getattr(ltx2, cls).from_config(cfg)
        import diffusers

        return getattr(diffusers, cls).from_config(cfg)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--depth", type=int, default=0)
    args = ap.parse_args()
    for model in ("ltx-2", "ltx-2.3"):
        folder = ROOT / model
        for name in ("transformer", "connectors", "vae", "audio_vae", "vocoder", "text_encoder"):
            m = build(folder, name)
            total = sum(p.numel() for p in m.parameters())
            print(f"{model} {name} {type(m).__name__} {total}")
            if args.depth:
                by = collections.Counter()
                for k, p in m.named_parameters():
                    parts = [s for s in k.split(".")]
                    by[".".join(parts[: args.depth])] += p.numel()
                for k, v in by.items():
                    print(f"    {k} {v}")


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
