"""Z-Image text-encoder fixtures: tiny random Qwen3 checkpoints, their `hidden_states[-2]`,
`ZImagePipeline._encode_prompt` embeddings, and Qwen2-tokenizer ids of chat-templated prompts.

    /root/.cache/flowtune/venv/bin/python scripts/reference_qwen3_text.py

Needs torch, transformers (5.x), diffusers (0.42); no GPU, no network; deterministic. Reuses the
real Qwen vocabulary and the prompt list of `reference_qwen_text.py` (Qwen3 shares Qwen2's base
vocabulary and pre-tokenizer). Writes into `fixtures/`:

- `qwen3_text_tokenizer_ids.json`: `[{"prompt", "text", "ids"}]`: each prompt through
  `apply_chat_template([user], add_generation_prompt=True, enable_thinking=True)` with Qwen3's
  chat template (its rendering of plain messages, `QWEN3_TEMPLATE`), and transformers' ids of it.
- `qwen3_text_<name>/`: tiny random checkpoints; `tiny` is a `Qwen3Model` (no `model.` prefix) with
  an explicit head_dim and grouped kv heads, `causal` a `Qwen3ForCausalLM` (`model.` keys and
  `lm_head`).
- `qwen3_text_<name>_io.safetensors`: `input.input_ids` / `input.attention_mask` (B, L) with right
  padding, `output.hidden_states_m2` = `hidden_states[-2]`; `prompts.<case>.embeds` / `.mask`: the
  list `ZImagePipeline._encode_prompt` returns, zero-padded to the longest row with its mask, for the
  tiny tokenizer `qwen_text_tiny_tokenizer` with `QWEN3_TEMPLATE`.
"""
import json
import shutil
import sys
import types
from pathlib import Path

import torch
from diffusers import ZImagePipeline
from transformers import Qwen2Tokenizer, Qwen3Config, Qwen3ForCausalLM, Qwen3Model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_qwen_text import prompts, real_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures"
# Qwen3's chat template as it renders plain messages and the generation prompt.
QWEN3_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined "
    "and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
PROMPT_CASES = {
    "mixed": (["a red circle", "Two BLUE squares, left of a triangle! 猫🐱 3.14", "", "x"], 512),
    "truncated": (["a photo of a cat sitting on a mat, in the morning light", "dog"], 12),
}
MODELS = {
    "tiny": dict(cls=Qwen3Model, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1e6, seed=21),
    "causal": dict(cls=Qwen3ForCausalLM, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                   num_attention_heads=3, num_key_value_heads=3, head_dim=8, rms_norm_eps=1e-5, rope_theta=1e4,
                   seed=22),
}


def templated(tokenizer, prompt):
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=True)


def tokenizer_ids():
    tok = Qwen2Tokenizer.from_pretrained(real_tokenizer(None))
    tok.chat_template = QWEN3_TEMPLATE
    rows = []
    for p in prompts():
        text = templated(tok, p)
        rows.append({"prompt": p, "text": text, "ids": tok(text)["input_ids"]})
    (FIX / "qwen3_text_tokenizer_ids.json").write_text(json.dumps(rows, ensure_ascii=False) + "\n")
    print(f"qwen3 tokenizer ids: {len(rows)} prompts")


def build(name, spec, vocab_size):
    cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=spec["hidden_size"],
                      intermediate_size=spec["intermediate_size"], num_hidden_layers=spec["num_hidden_layers"],
                      num_attention_heads=spec["num_attention_heads"], num_key_value_heads=spec["num_key_value_heads"],
                      head_dim=spec["head_dim"], rms_norm_eps=spec["rms_norm_eps"],
                      rope_parameters=dict(rope_type="default", rope_theta=spec["rope_theta"]),
                      max_position_embeddings=4096)
    torch.manual_seed(spec["seed"])
    model = spec["cls"](cfg).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in pname else 0.1 * torch.randn_like(p))
    out = FIX / f"qwen3_text_{name}"
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out)
    loaded, info = spec["cls"].from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], (name, info)
    return loaded.eval()


def padded(rows):
    longest = max(len(r) for r in rows)
    embeds = torch.zeros(len(rows), longest, rows[0].shape[1])
    mask = torch.zeros(len(rows), longest, dtype=torch.int64)
    for i, r in enumerate(rows):
        embeds[i, : len(r)] = r
        mask[i, : len(r)] = 1
    return embeds, mask


def model_fixtures():
    from safetensors.torch import save_file

    tokenizer = Qwen2Tokenizer.from_pretrained(FIX / "qwen_text_tiny_tokenizer")
    tokenizer.chat_template = QWEN3_TEMPLATE
    vocab_size = len(tokenizer)
    for name, spec in MODELS.items():
        model = build(name, spec, vocab_size)
        encoder = model.model if isinstance(model, Qwen3ForCausalLM) else model
        gen = torch.Generator().manual_seed(spec["seed"] + 100)
        lengths = [11, 7, 1]
        ids = torch.randint(0, vocab_size, (len(lengths), max(lengths)), generator=gen)
        mask = torch.zeros_like(ids)
        for row, n in enumerate(lengths):
            mask[row, :n] = 1
            ids[row, n:] = tokenizer.pad_token_id
        with torch.no_grad():
            out = encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        tensors = {"input.input_ids": ids, "input.attention_mask": mask,
                   "output.hidden_states_m2": out.hidden_states[-2]}
        pipe = types.SimpleNamespace(text_encoder=encoder, tokenizer=tokenizer, _execution_device=torch.device("cpu"))
        for case, (texts, max_len) in PROMPT_CASES.items():
            with torch.no_grad():
                rows = ZImagePipeline._encode_prompt(pipe, list(texts), device=torch.device("cpu"),
                                                     max_sequence_length=max_len)
            tensors[f"prompts.{case}.embeds"], tensors[f"prompts.{case}.mask"] = padded(rows)
        save_file({k: v.contiguous() for k, v in tensors.items()}, FIX / f"qwen3_text_{name}_io.safetensors")
        print(f"qwen3_text_{name}: " + ", ".join(f"{k} {tuple(v.shape)}" for k, v in tensors.items()))


def main():
    tokenizer_ids()
    model_fixtures()


if __name__ == "__main__":
    main()
