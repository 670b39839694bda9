"""CLIP-L tokenizer parity on the real vocabulary (the `tokenizer` of FLUX.1 and SD3 pipelines).

Builds openai/clip-vit-large-patch14's vocabulary from OpenAI's BPE file (`bpe_simple_vocab_16e6.txt.gz`,
which `scripts/setup-rewards.sh` keeps under $FLOWTUNE_CACHE/clip): 256 byte symbols, the same with `</w>`,
one token per merge, then `<|startoftext|>` and `<|endoftext|>`. transformers' `CLIPTokenizer` is made from it
and saved; its `tokenizer.json` (gzipped) and config go to `fixtures/clip_l_tokenizer/`, and the ids the
pipelines use (padding to 77, truncation) of 200+ prompts to `fixtures/clip_l_tokenizer_ids.json`.

Usage: python scripts/reference_clip_tokenizer.py $FLOWTUNE_CACHE/clip/bpe_simple_vocab_16e6.txt.gz fixtures
"""
import gzip
import json
import os
import shutil
import sys
import tempfile

from transformers import CLIPTokenizer

sys.path.insert(0, os.path.dirname(__file__))
from reference_qwen_text import prompts  # noqa: E402


def byte_symbols():
    """GPT-2's printable stand-ins for the 256 byte values, in their order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return [chr(c) for c in chars]


def main(bpe_file, out):
    lines = gzip.open(bpe_file, "rt", encoding="utf-8").read().split("\n")
    merges = [tuple(l.split()) for l in lines[1 : 49152 - 256 - 2 + 1]]
    symbols = byte_symbols()
    vocab = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "vocab.json"), "w", encoding="utf-8") as f:
            json.dump({t: i for i, t in enumerate(vocab)}, f, ensure_ascii=False)
        with open(os.path.join(tmp, "merges.txt"), "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
        tok = CLIPTokenizer(os.path.join(tmp, "vocab.json"), os.path.join(tmp, "merges.txt"), model_max_length=77)
        saved = os.path.join(tmp, "saved")
        tok.save_pretrained(saved)
        target = os.path.join(out, "clip_l_tokenizer")
        os.makedirs(target, exist_ok=True)
        with open(os.path.join(saved, "tokenizer.json"), "rb") as src, gzip.GzipFile(
            os.path.join(target, "tokenizer.json.gz"), "wb", mtime=0
        ) as dst:
            shutil.copyfileobj(src, dst)
        shutil.copy(os.path.join(saved, "tokenizer_config.json"), target)
        tok = CLIPTokenizer.from_pretrained(saved)
    cases = []
    for p in prompts():
        ids = tok(p, padding="max_length", max_length=77, truncation=True).input_ids
        cases.append({"prompt": p, "ids": ids})
    with open(os.path.join(out, "clip_l_tokenizer_ids.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False)
    print(f"{len(cases)} prompts, vocabulary {len(vocab)}")


if __name__ == "__main__":
    main(*sys.argv[1:])
