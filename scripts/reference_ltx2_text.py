"""LTX-2 text-path fixtures: Gemma-3 hidden states, `LTX2Pipeline._get_gemma_prompt_embeds` and
`LTX2TextConnectors` outputs for the tiny models flowtune's writers made.

    cargo test --release -p flowtune-models --test ltx2_text -- --ignored write_fixture_models
    flock fixtures/.manifest.lock /root/.cache/flowtune/venv/bin/python scripts/reference_ltx2_text.py fixtures

Needs torch, transformers (5.x), diffusers (0.42), safetensors; no GPU, no network; deterministic.
Reads `<out>/ltx2_text_tiny/` (the Rust writers' output: `text_encoder/` a tiny
`Gemma3ForConditionalGeneration` in LTX-2's transformers-4 config layout, `tokenizer/` a tiny
Gemma BPE, `connectors_ltx20/` and `connectors_ltx23/` tiny `LTX2TextConnectors`), checks that
transformers and diffusers load them without missing or unexpected tensors, and writes:

- `ltx2_text_tiny/text_encoder_v5/config.json`: the text encoder's config as transformers 5 saves
  it (`rope_parameters` by layer type, `layer_types`); its weights are `text_encoder/`'s (checked).
- `ltx2_text_tokenizer_ids.json`: `[{"prompt", "ids"}]`, transformers' ids (with `<bos>`, no
  padding) of a few prompts, unicode and byte-fallback ones included.
- `ltx2_text_io.safetensors`: `gemma3.input_ids` / `gemma3.attention_mask` (B, L) left-padded,
  `gemma3.hidden_states.<k>` every hidden state; for each prompt case `prompts.<case>.input_ids` /
  `.mask` / `.embeds` of `_get_gemma_prompt_embeds` (max_sequence_length in the name's table) and
  `prompts.<case>.<connectors>.{video,audio,mask}` of `connectors(embeds, mask, padding_side="left")`;
  `right.<connectors>.*` the connectors on random right-padded embeds with `padding_side="right"`.
"""
import json
import shutil
import sys
import tempfile
import types
from pathlib import Path

import torch
from diffusers import LTX2Pipeline
from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, Gemma3ForConditionalGeneration

sys.path.insert(0, str(Path(__file__).resolve().parent))
from transformer_fixtures import update_manifest  # noqa: E402

PROMPT_CASES = {
    "mixed": (["a red circle", "  Two cats sitting on a mat, 猫🐱 at night!  ", "x"], 16),
    "truncated": (["A woman walks through a rainy neon street at night, the camera follows her", "",
                   "\u3000\x1fcafé\x1c\n"], 8),
}
TOKENIZER_PROMPTS = [
    "a red circle next to a blue square",
    "Two cats sitting on a mat in the morning light, photo, cinematic",
    "  leading and trailing spaces  ",
    "double  spaces and\nnew lines\tand tabs",
    "unicode: 猫🐱 café naïve Ωmega",
    "<bos> literal specials <eos> and <0x41>",
    "",
]
CONNECTORS = ["connectors_ltx20", "connectors_ltx23"]


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "fixtures")
    root = out / "ltx2_text_tiny"
    torch.manual_seed(0)

    tokenizer = AutoTokenizer.from_pretrained(root / "tokenizer")
    assert type(tokenizer).__name__ in ("GemmaTokenizer", "GemmaTokenizerFast"), type(tokenizer)
    rows = [{"prompt": p, "ids": tokenizer(p)["input_ids"]} for p in TOKENIZER_PROMPTS]
    (out / "ltx2_text_tokenizer_ids.json").write_text(json.dumps(rows, ensure_ascii=False, indent=1) + "\n")

    encoder, info = Gemma3ForConditionalGeneration.from_pretrained(root / "text_encoder", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    encoder = encoder.eval()
    v5 = root / "text_encoder_v5"
    if v5.exists():
        shutil.rmtree(v5)
    with tempfile.TemporaryDirectory() as tmp:
        encoder.save_pretrained(tmp)
        resaved, original = load_file(Path(tmp) / "model.safetensors"), load_file(root / "text_encoder" / "model.safetensors")
        assert resaved.keys() == original.keys() and all(torch.equal(resaved[k], original[k]) for k in original)
        v5.mkdir()
        shutil.copy(Path(tmp) / "config.json", v5 / "config.json")

    io = {}
    g = torch.Generator().manual_seed(5)
    lengths, length = [12, 7, 1], 12
    vocab = encoder.config.text_config.vocab_size
    ids = torch.full((len(lengths), length), tokenizer.pad_token_id, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, length - n:] = torch.randint(5, vocab, (n,), generator=g)
        ids[row, length - n] = tokenizer.bos_token_id
        mask[row, length - n:] = 1
    with torch.no_grad():
        states = encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    io["gemma3.input_ids"], io["gemma3.attention_mask"] = ids, mask
    for k, s in enumerate(states):
        io[f"gemma3.hidden_states.{k}"] = s
    print(f"gemma3: {len(states)} hidden states {tuple(states[0].shape)}")

    connectors = {}
    for name in CONNECTORS:
        model, info = LTX2TextConnectors.from_pretrained(root / name, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], (name, info)
        connectors[name] = model.eval()

    pipe = types.SimpleNamespace(tokenizer=tokenizer, text_encoder=encoder, _execution_device=torch.device("cpu"))
    for case, (prompts, max_len) in PROMPT_CASES.items():
        with torch.no_grad():
            embeds, pmask = LTX2Pipeline._get_gemma_prompt_embeds(pipe, prompts, max_sequence_length=max_len,
                                                                  device=torch.device("cpu"))
        ids = tokenizer([p.strip() for p in prompts], padding="max_length", max_length=max_len, truncation=True,
                        return_tensors="pt").input_ids
        io[f"prompts.{case}.input_ids"], io[f"prompts.{case}.mask"] = ids, pmask
        io[f"prompts.{case}.embeds"] = embeds
        for name, model in connectors.items():
            with torch.no_grad():
                video, audio, vmask = model(embeds, pmask, padding_side="left")
            io[f"prompts.{case}.{name}.video"] = video
            io[f"prompts.{case}.{name}.audio"] = audio
            io[f"prompts.{case}.{name}.mask"] = vmask
        print(f"prompts.{case}: embeds {tuple(embeds.shape)}, mask rows {pmask.sum(-1).tolist()}")

    width = embeds.shape[-1]
    rmask = torch.zeros(2, 16, dtype=torch.int64)
    rmask[0, :11] = 1
    rmask[1, :3] = 1
    rembeds = torch.randn(2, 16, width, generator=g) * rmask[..., None]
    io["right.embeds"], io["right.mask"] = rembeds, rmask
    for name, model in connectors.items():
        with torch.no_grad():
            video, audio, vmask = model(rembeds, rmask, padding_side="right")
        io[f"right.{name}.video"], io[f"right.{name}.audio"], io[f"right.{name}.mask"] = video, audio, vmask

    save_file({k: v.contiguous() for k, v in io.items()}, out / "ltx2_text_io.safetensors")
    update_manifest(str(out), [
        {"name": "ltx2_text_tiny", "kind": "ltx2_gemma3", "model": "ltx2_text_tiny/text_encoder",
         "configs": ["ltx2_text_tiny/text_encoder/config.json", "ltx2_text_tiny/text_encoder_v5/config.json"],
         "class": "Gemma3ForConditionalGeneration", "io": "ltx2_text_io.safetensors"},
    ], "ltx2_gemma3")
    update_manifest(str(out), [
        {"name": name, "kind": "ltx2_connectors", "model": f"ltx2_text_tiny/{name}", "class": "LTX2TextConnectors",
         "io": "ltx2_text_io.safetensors"} for name in CONNECTORS
    ], "ltx2_connectors")


if __name__ == "__main__":
    main()
