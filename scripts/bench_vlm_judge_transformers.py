"""The transformers anchor of `flowtune bench reward --transformers` for a native `vlm_judge`: the same
judge folder, pictures, prompts and batches answered by `model.generate(do_sample=False)`, laid out as
`reference_vlm_judge.py` lays out a batch (the processor's steps written out: Qwen3-VL's processor class needs
torchvision).

Usage (needs torch, transformers 5 and Pillow; flowtune runs it with the arguments below):
    python scripts/bench_vlm_judge_transformers.py --model DIR --settings JSON --count 16 --resolution 512 \
        --iters 3 [--device cpu] [--dtype float32]

JSON holds the judge's `vlm:` settings (`system_prompt`, `user_prompt`, `max_tokens`, `batch_size`,
`answer_prefix`). The pictures and prompts are `flowtune bench reward`'s: picture i is
RGB = ((x·k) mod 251, (3y + x·k) mod 253, ((x xor y)·k) mod 241) with k = i + 1, prompt
`a sign that says "flowtune i"`. Prints one JSON line: `seconds` (mean per call of all `count` pictures, after one
warm-up call, synchronised), the decoded `answers` and each answer's token count before its end token
(`answer_tokens`, so the caller can check both did the same work).
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_vlm_judge import batch, load, messages  # noqa: E402


def picture(index: int, side: int) -> Image.Image:
    k = index + 1
    y, x = np.mgrid[0:side, 0:side].astype(np.int64)
    rgb = np.stack([(x * k) % 251, (y * 3 + x * k) % 253, ((x ^ y) * k) % 241], axis=-1).astype(np.uint8)
    return Image.fromarray(rgb, "RGB")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--settings", required=True)
    ap.add_argument("--count", type=int, default=16)
    ap.add_argument("--resolution", type=int, default=512)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    a = ap.parse_args()
    s = json.loads(a.settings)
    model, tokenizer, processor = load(Path(a.model))
    model = model.to(device=a.device, dtype=getattr(torch, a.dtype))
    pictures = [picture(i, a.resolution) for i in range(a.count)]
    prompts = [f'a sign that says "flowtune {i}"' for i in range(a.count)]
    system = s.get("system_prompt") or None

    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])

    def call():
        answers, lengths = [], []
        for start in range(0, a.count, s["batch_size"]):
            rows = list(range(start, min(start + s["batch_size"], a.count)))
            conversations = [messages(system, s["user_prompt"].replace("{prompt}", prompts[i])) for i in rows]
            _, inputs = batch(model, tokenizer, processor, conversations, [pictures[i] for i in rows],
                              s.get("answer_prefix", ""))
            inputs = {k: v.to(a.device) for k, v in inputs.items()}
            inputs["pixel_values"] = inputs["pixel_values"].to(model.dtype)
            with torch.no_grad():
                out = model.generate(**inputs, do_sample=False, max_new_tokens=s["max_tokens"])
            new = out[:, inputs["input_ids"].shape[1]:]
            answers += tokenizer.batch_decode(new, skip_special_tokens=True)
            for row in new.tolist():
                lengths.append(next((k for k, t in enumerate(row) if t in eos), len(row)))
        return answers, lengths

    def sync():
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()

    answers, lengths = call()
    sync()
    start = time.perf_counter()
    for _ in range(a.iters):
        call()
    sync()
    seconds = (time.perf_counter() - start) / a.iters
    print(json.dumps({"seconds": seconds, "answers": answers, "answer_tokens": lengths}))


if __name__ == "__main__":
    main()
