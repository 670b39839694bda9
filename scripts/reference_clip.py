"""CLIP reward fixtures: tiny random CLIP models, their reference outputs, and CLIP tokenizer ids.

    python scripts/reference_clip.py

(run with the flowtune venv: `/root/.cache/flowtune/venv/bin/python scripts/reference_clip.py`).
Needs torch, transformers (5.x), safetensors, numpy and Pillow; no GPU, no network. The
tokenizer part reads OpenAI CLIP's BPE file `bpe_simple_vocab_16e6.txt.gz` (from the `clip-anytorch`
wheel); pass its path with `--bpe` if it is not at `/root/.cache/flowtune/clip/`.

Everything is deterministic (fixed seeds) and written to `crates/rewards/tests/fixtures/clip/`:

- `image_0.png` .. `image_3.png`: four RGB pictures of different sizes/aspect ratios
  (gradients, shapes and noise).
- `clip_tiny/`, `clip_h_tiny/`: two tiny random `transformers.CLIPModel`s saved with
  `save_pretrained` (`config.json`, `model.safetensors`, float32), plus the
  `preprocessor_config.json` of a `CLIPImageProcessor` (shortest edge 32, 32x32 centre crop,
  bicubic, OpenAI mean/std). `clip_tiny` uses quick_gelu, 8px patches, projection 16,
  logit_scale = ln 50; `clip_h_tiny` uses gelu, 16px patches, projection 24, logit_scale = ln 100.
- `<model>_io.safetensors` (beside the model folder, which must hold one checkpoint): inputs and
  reference outputs of each model:
  `pixel_values` [4,3,32,32] f32 (CLIPImageProcessor on the PNGs), `input_ids` [4,12] i64 and
  `attention_mask` [4,12] i64 (bos 998, random ids, eos 999, pad 1), `image_embeds` / `text_embeds`
  [4,P] (projected, not normalised), `vision_last_hidden_state` [4,1+patches,H_v], `vision_pooled`
  [4,H_v] (post-layernorm CLS), `text_last_hidden_state` [4,12,H_t] (after final layer norm),
  `text_pooled` [4,H_t] (eos position), `logit_scale` [] (raw parameter),
  `clip_score` [4] = 100 * max(cos(img_i, txt_i), 0), `pickscore` [4] = exp(logit_scale) *
  cos(img_i, txt_i); for `clip_tiny` also `aesthetic` [4] = head(img_i / ||img_i||).
- `aesthetic_head.safetensors`: a LAION-aesthetic-shaped MLP (Linear, Dropout, Linear, Dropout,
  Linear, Dropout, Linear, Linear; keys `layers.{0,2,4,6,7}.{weight,bias}`) with widths
  16 -> 32 -> 16 -> 8 -> 4 -> 1.
- `tokenizer_ids.json`: `[{"prompt": str, "ids": [77 ints]}, ...]` from `transformers.CLIPTokenizer.from_pretrained`
  built on a vocab.json/merges.txt derived from the BPE file the way OpenAI CLIP builds its
  vocabulary (`padding="max_length", max_length=77, truncation=True`).
- `tokenizer_pipeline.json`: the tokenizer's `tokenizers` JSON (normalizer, pre_tokenizer,
  model options, post_processor, decoder, added tokens) with the model's vocab and merges removed.
"""

import argparse
import gzip
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from PIL import Image, ImageDraw
from safetensors.torch import save_file
from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates/rewards/tests/fixtures/clip"
DEFAULT_BPE = Path("/root/.cache/flowtune/clip/bpe_simple_vocab_16e6.txt.gz")

IMAGE_SIZES = [(48, 40), (64, 64), (40, 72), (33, 50)]  # (width, height)
SEQ_LEN = 12
CONTENT_LENGTHS = [3, 10, 6, 1]  # random ids between bos and eos; row 1 fills all 12 slots
BOS, EOS, PAD = 998, 999, 1

MODELS = {
    # seeds chosen so that cos(image_i, text_i) takes both signs with |cos| > 0.05
    "clip_tiny": dict(act="quick_gelu", patch=8, projection_dim=16, logit_scale=math.log(50.0),
                      layer_norm_eps=None, seed=1246),
    "clip_h_tiny": dict(act="gelu", patch=16, projection_dim=24, logit_scale=math.log(100.0),
                        layer_norm_eps=1e-5, seed=5702),
}
AESTHETIC_WIDTHS = [16, 32, 16, 8, 4, 1]


# ----------------------------------------------------------------------------------------------
# Images


def make_image(index: int, width: int, height: int) -> Image.Image:
    rng = np.random.default_rng(100 + index)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    u, v = x / max(width - 1, 1), y / max(height - 1, 1)
    phase = index * 0.9
    base = np.stack(
        [
            255 * u,
            255 * (0.5 + 0.5 * np.sin(6.0 * v + phase)),
            255 * (1.0 - 0.5 * (u + v)),
        ],
        axis=-1,
    )
    image = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(3):
        x0, y0 = int(rng.integers(0, width // 2)), int(rng.integers(0, height // 2))
        x1, y1 = x0 + int(rng.integers(4, width // 2 + 1)), y0 + int(rng.integers(4, height // 2 + 1))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            draw.ellipse([x0, y0, x1, y1], fill=colour)
        else:
            draw.rectangle([x0, y0, x1, y1], fill=colour)
    draw.line([0, height - 1, width - 1, 0], fill=(255, 255, 255), width=2)
    pixels = np.asarray(image).astype(np.int16) + rng.integers(-20, 21, (height, width, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


# ----------------------------------------------------------------------------------------------
# Models


def clip_config(spec: dict) -> CLIPConfig:
    eps = {} if spec["layer_norm_eps"] is None else {"layer_norm_eps": spec["layer_norm_eps"]}
    text = dict(vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=77, bos_token_id=BOS,
                eos_token_id=EOS, pad_token_id=PAD, hidden_act=spec["act"], **eps)
    vision = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  image_size=32, patch_size=spec["patch"], num_channels=3, hidden_act=spec["act"],
                  **eps)
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=spec["projection_dim"],
                      logit_scale_init_value=spec["logit_scale"])


@torch.no_grad()
def randomise(model: torch.nn.Module, seed: int, logit_scale: float | None = None) -> None:
    """Normal(0, 0.2) everywhere; layer norms get weight ~ 1 + N(0, 0.1), bias ~ N(0, 0.1)."""
    gen = torch.Generator().manual_seed(seed)
    norm_params = set()
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            norm_params.update(id(p) for p in module.parameters(recurse=False))
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
        if name == "logit_scale":
            param.fill_(logit_scale)
        elif id(param) in norm_params:
            param.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * noise)
        else:
            param.copy_(0.2 * noise)


def make_input_ids(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.full((len(CONTENT_LENGTHS), SEQ_LEN), PAD, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(CONTENT_LENGTHS):
        ids[row, 0] = BOS
        ids[row, 1 : 1 + n] = torch.randint(2, 998, (n,), generator=gen)
        ids[row, 1 + n] = EOS
        mask[row, : n + 2] = 1
    return ids, mask


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))


def projected(out) -> torch.Tensor:
    """get_*_features returns a tensor in transformers 4 and an output object in transformers 5."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


class AestheticHead(torch.nn.Module):
    def __init__(self, widths: list[int]):
        super().__init__()
        w = widths
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(w[0], w[1]), torch.nn.Dropout(0.2),
            torch.nn.Linear(w[1], w[2]), torch.nn.Dropout(0.2),
            torch.nn.Linear(w[2], w[3]), torch.nn.Dropout(0.1),
            torch.nn.Linear(w[3], w[4]),
            torch.nn.Linear(w[4], w[5]),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


@torch.no_grad()
def build_aesthetic_head() -> AestheticHead:
    head = AestheticHead(AESTHETIC_WIDTHS)
    gen = torch.Generator().manual_seed(4321)
    for name, param in head.named_parameters():
        std = 0.5 if name.endswith("weight") else 0.1
        param.copy_(std * torch.randn(param.shape, generator=gen))
    return head.eval()


@torch.no_grad()
def write_model(name: str, spec: dict, pixel_values: torch.Tensor, processor: CLIPImageProcessor,
                head: AestheticHead | None) -> dict:
    torch.manual_seed(spec["seed"])
    config = clip_config(spec)
    config._attn_implementation = "eager"
    model = CLIPModel(config)
    randomise(model, spec["seed"], spec["logit_scale"])
    model.eval()
    folder = OUT / name
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    processor.save_pretrained(folder)

    input_ids, attention_mask = make_input_ids(spec["seed"] + 1)
    image_embeds = projected(model.get_image_features(pixel_values=pixel_values))
    text_embeds = projected(model.get_text_features(input_ids=input_ids))
    masked = projected(model.get_text_features(input_ids=input_ids, attention_mask=attention_mask))
    assert torch.allclose(text_embeds, masked, atol=1e-5), "attention mask changed text embeds"
    vision = model.vision_model(pixel_values=pixel_values)
    text = model.text_model(input_ids=input_ids)
    assert torch.allclose(model.visual_projection(vision.pooler_output), image_embeds, atol=1e-6)
    assert torch.allclose(model.text_projection(text.pooler_output), text_embeds, atol=1e-6)

    logit_scale = model.logit_scale.detach().clone().reshape(())
    cos = cosine(image_embeds, text_embeds)
    # Seeds were picked so that both signs occur (the CLIPScore clamp at 0 is exercised).
    assert (cos > 0.05).any() and (cos < -0.05).any(), cos
    tensors = {
        "pixel_values": pixel_values,
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "image_embeds": image_embeds,
        "text_embeds": text_embeds,
        "vision_last_hidden_state": vision.last_hidden_state,
        "vision_pooled": vision.pooler_output,
        "text_last_hidden_state": text.last_hidden_state,
        "text_pooled": text.pooler_output,
        "logit_scale": logit_scale,
        "clip_score": 100.0 * cos.clamp(min=0.0),
        "pickscore": logit_scale.exp() * cos,
    }
    if head is not None:
        tensors["aesthetic"] = head(image_embeds / image_embeds.norm(dim=-1, keepdim=True)).squeeze(-1)
    tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    for k, v in tensors.items():
        assert torch.isfinite(v.float()).all(), k
    save_file(tensors, str(folder.parent / f"{folder.name}_io.safetensors"))
    return {"cos": cos.tolist(), **{k: list(v.shape) for k, v in tensors.items()}}


# ----------------------------------------------------------------------------------------------
# Tokenizer


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode map, in its canonical order."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table, extra = {}, 0
    for b in printable:
        table[b] = chr(b)
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def write_vocab_and_merges(bpe_path: Path, folder: Path) -> tuple[Path, Path]:
    lines = gzip.open(bpe_path, "rt", encoding="utf-8").read().split("\n")
    merge_lines = lines[1 : 49152 - 256 - 2 + 1]
    pairs = [tuple(line.split()) for line in merge_lines]
    assert all(len(p) == 2 for p in pairs)
    chars = list(byte_to_unicode().values())
    vocab = chars + [c + "</w>" for c in chars] + ["".join(p) for p in pairs]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    assert len(vocab) == 49408 and len(set(vocab)) == 49408
    vocab_file, merges_file = folder / "vocab.json", folder / "merges.txt"
    vocab_file.write_text(json.dumps({tok: i for i, tok in enumerate(vocab)}, ensure_ascii=False),
                          encoding="utf-8")
    merges_file.write_text("#version: 0.2\n" + "\n".join(" ".join(p) for p in pairs) + "\n",
                           encoding="utf-8")
    return vocab_file, merges_file


HAND_PROMPTS = [
    "",
    "a photo of a cat",
    "A photo of a cat",
    "A PHOTO OF A CAT",
    "a photo of a dog sitting on a red couch",
    "An astronaut riding a horse on the moon, digital art",
    "a watercolor painting of a lighthouse at sunset, trending on artstation",
    "portrait of a woman, 85mm, f/1.8, bokeh, highly detailed, 8k",
    "a bowl of ramen, studio lighting, 4K, ultra-realistic",
    "cyberpunk city street at night, neon signs, rain, reflections",
    "a cute corgi wearing sunglasses",
    "a cozy cabin in the snowy mountains",
    "low-poly 3D render of a fox",
    "oil painting of a ship in a storm by J.M.W. Turner",
    "a sign that says \"OPEN 24h\"",
    "a sign that says 'SALE 50% OFF'",
    "A neon sign reading \u201cHello World\u201d",
    "the word \u2018flow\u2019 written in chalk",
    "It's a beautiful day",
    "it's",
    "IT'S",
    "don't stop",
    "DON'T STOP",
    "they're here",
    "we've been there",
    "I'm hungry",
    "I'M HUNGRY",
    "I'm",
    "you'll see",
    "YOU'LL SEE",
    "he'd go",
    "HE'D GO",
    "the cat's toy",
    "the cats' toys",
    "rock 'n' roll",
    "'s",
    "'quoted'",
    "\"double quoted\"",
    "it\u2019s curly",
    "I\u2019m curly",
    "\u201csmart quotes\u201d and \u2018single ones\u2019",
    "3.5 apples",
    "version 2.0.1",
    "24h",
    "24 hours",
    "1234567890",
    "the year 2024",
    "$100 bill",
    "3/4 view",
    "100%",
    "-5 degrees",
    "1,000,000 stars",
    "0.001",
    "pi is 3.14159",
    "x2",
    "4k 8k 16k",
    "well-known state-of-the-art model",
    "a -- b",
    "em\u2014dash and en\u2013dash",
    "hello, world!",
    "what?!",
    "wait...",
    "(parentheses) [brackets] {braces}",
    "a/b\\c",
    "email@example.com",
    "https://example.com/path?query=1&x=2",
    "#hashtag @mention",
    "snake_case_name",
    "camelCaseName",
    "C++ and C#",
    "1+1=2",
    "a*b^c",
    "~tilde~",
    "`backticks`",
    "semi;colon:colon",
    "<html> tags </html>",
    "<|startoftext|>",
    "<|endoftext|>",
    "a <|endoftext|> b",
    "<|startoftext|>a photo<|endoftext|>",
    "fish &amp; chips",
    "&lt;tag&gt;",
    "&quot;quoted&quot;",
    "&#39;apostrophe&#39;",
    "&amp;amp;",
    "tom &amp; jerry",
    "  leading spaces",
    "trailing spaces   ",
    "   both   ",
    "multiple     spaces    between",
    "tab\tseparated\twords",
    "new\nline",
    "windows\r\nline",
    "\n\nleading newlines",
    "mixed \t\n whitespace",
    " ",
    "\t",
    "\n",
    "non\u00a0breaking\u00a0space",
    "ideographic\u3000space",
    "em\u2003space",
    "zero\u200bwidth",
    "caf\u00e9",
    "CAF\u00c9",
    "cafe\u0301 (decomposed)",
    "na\u00efve",
    "r\u00e9sum\u00e9",
    "\u00fcber",
    "\u00dcBER",
    "Stra\u00dfe",
    "se\u00f1or",
    "\u00e5ngstr\u00f6m",
    "cr\u00e8me br\u00fbl\u00e9e",
    "\u0141\u00f3d\u017a",
    "\u0130stanbul",
    "\u03b1\u03b2\u03b3 greek",
    "\u041c\u043e\u0441\u043a\u0432\u0430",
    "\u732b",
    "\u4e00\u53ea\u732b\u5750\u5728\u6c99\u53d1\u4e0a",
    "\u6771\u4eac\u30bf\u30ef\u30fc",
    "\u3072\u3089\u304c\u306a\u3068\u30ab\u30bf\u30ab\u30ca",
    "\ud55c\uad6d\uc5b4 \ubb38\uc7a5",
    "\u0645\u0631\u062d\u0628\u0627",
    "\u05e9\u05dc\u05d5\u05dd",
    "\u0928\u092e\u0938\u094d\u0924\u0947",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
    "a cat \U0001f431",
    "\U0001f600\U0001f600\U0001f600",
    "\U0001f44d\U0001f3fd",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467",
    "\u2764\ufe0f love",
    "\U0001f1eb\U0001f1f7 flag",
    "\u2605\u2606 stars \u2192 arrow",
    "\u00a9 2024 \u00ae \u2122",
    "\u00bd cup",
    "\u00b2 squared",
    "\u2460 circled",
    "\uff21\uff22\uff23 fullwidth",
    "\ufb01 ligature",
    "\u212b angstrom sign",
    "ALL CAPS PROMPT WITH NUMBERS 123",
    "MiXeD cAsE pRoMpT",
    "a",
    "A",
    "!",
    "!!!",
    "...",
    "0",
    "a1b2c3",
    "photo123",
    "a  a",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "supercalifragilisticexpialidocious",
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "photorealistic, hyperrealistic, masterpiece, best quality, ultra detailed",
    "(masterpiece:1.2), (best quality:1.1), 1girl, solo",
    "[[double brackets]] ((double parens))",
    "a photo of a cat | a photo of a dog",
    "prompt with trailing comma,",
    ",leading comma",
    "a red cube on top of a blue sphere, next to a green cylinder",
    "two dogs and three cats",
    "five apples on a wooden table",
    "a giraffe to the left of a zebra",
]

LONG_PROMPTS = [
    " ".join(["a beautiful detailed landscape with mountains, rivers, forests and a castle"] * 6),
    ", ".join(f"item {i}" for i in range(60)),
    "word " * 100,
    "A" * 400,
    "1234567890" * 12,
    "!?" * 80,
    "\u732b" * 120,
    "\U0001f431" * 30,
    ("An extremely long and elaborate prompt describing a sprawling fantasy metropolis at dusk, "
     "with towering spires of glass and brass, airships drifting between the buildings, lanterns "
     "glowing in thousands of windows, merchants crowding the cobblestone streets below, a river "
     "winding through the center reflecting the orange sky, and distant snow-capped mountains on "
     "the horizon, rendered in the style of a classical oil painting with rich textures"),
    "It's I'M we've they're you'll he'd don't " * 12,
    "&amp; " * 50,
    "caf\u00e9 na\u00efve " * 40,
]

SUBJECTS = ["a cat", "a corgi", "an old man", "a robot", "a red sports car", "a teapot",
            "a lighthouse", "a dragon", "two astronauts", "a bowl of fruit", "a violin",
            "the Eiffel Tower", "a koi pond", "a steam locomotive"]
SETTINGS = ["in a forest", "on the beach at sunset", "in Tokyo at night", "on Mars",
            "underwater", "in a 1920s jazz club", "on a snowy mountain", "in a library"]
STYLES = ["oil painting", "pixel art", "35mm film photo", "Studio Ghibli style",
          "isometric 3D render", "pencil sketch", "ukiyo-e woodblock print", "HDR, 8K"]


def prompts() -> list[str]:
    rng = np.random.default_rng(77)
    generated = []
    for i in range(72):
        s = SUBJECTS[rng.integers(len(SUBJECTS))]
        p = SETTINGS[rng.integers(len(SETTINGS))]
        st = STYLES[rng.integers(len(STYLES))]
        form = i % 4
        if form == 0:
            generated.append(f"{s} {p}, {st}")
        elif form == 1:
            generated.append(f"{st.upper()}: {s.capitalize()} {p}!")
        elif form == 2:
            generated.append(f"A photo of {s} {p} ({int(rng.integers(1, 100))}mm, f/{rng.integers(1, 23) / 2})")
        else:
            generated.append(f"\"{s.title()}\"\u2014{p}; {st.lower()}  ")
    out = HAND_PROMPTS + LONG_PROMPTS + generated
    assert len(out) == len(set(out)), "duplicate prompts"
    return out


def pipeline_json(tok) -> dict:
    data = json.loads(tok.backend_tokenizer.to_str())
    data["model"].pop("vocab", None)
    data["model"].pop("merges", None)
    return data


def write_tokenizer(bpe_path: Path) -> dict:
    # transformers 5: CLIPTokenizer is the tokenizers-backed class (CLIPTokenizerFast is an alias).
    # Its constructor takes `vocab=`/`merges=` (dicts/lists or file paths); `vocab_file=`/`merges_file=`
    # keyword arguments are silently ignored there (a 3-token vocabulary results), so the
    # tokenizer is loaded with `from_pretrained` on the folder, and cross-checked against the
    # explicit constructor.
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file, merges_file = write_vocab_and_merges(bpe_path, Path(tmp))
        tok = CLIPTokenizer.from_pretrained(tmp)
        tok_explicit = CLIPTokenizer(vocab=str(vocab_file), merges=str(merges_file))
    fast_cls = getattr(transformers, "CLIPTokenizerFast", None)
    assert len(tok) == 49408, len(tok)
    items = []
    for prompt in prompts():
        ids = tok(prompt, padding="max_length", max_length=77, truncation=True)["input_ids"]
        again = tok_explicit(prompt, padding="max_length", max_length=77, truncation=True)["input_ids"]
        assert ids == again, prompt
        assert len(ids) == 77
        items.append({"prompt": prompt, "ids": ids})
    with open(OUT / "tokenizer_ids.json", "w", encoding="utf-8") as f:
        f.write("[\n")
        f.write(",\n".join(json.dumps(item, ensure_ascii=False) for item in items))
        f.write("\n]\n")
    pipeline = pipeline_json(tok)
    (OUT / "tokenizer_pipeline.json").write_text(json.dumps(pipeline, indent=2, ensure_ascii=False) + "\n",
                                                 encoding="utf-8")
    return {
        "class": f"{type(tok).__module__}.{type(tok).__name__}",
        "backend": type(tok.backend_tokenizer).__module__ + "." + type(tok.backend_tokenizer).__name__,
        "CLIPTokenizerFast": None if fast_cls is None else f"{fast_cls.__module__}.{fast_cls.__name__}",
        "prompts": len(items),
        "special": {"bos": (tok.bos_token, tok.bos_token_id), "eos": (tok.eos_token, tok.eos_token_id),
                    "pad": (tok.pad_token, tok.pad_token_id), "unk": (tok.unk_token, tok.unk_token_id)},
    }


# ----------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bpe", type=Path, default=DEFAULT_BPE, help="bpe_simple_vocab_16e6.txt.gz")
    args = parser.parse_args()
    torch.manual_seed(0)
    OUT.mkdir(parents=True, exist_ok=True)

    paths = []
    for i, (w, h) in enumerate(IMAGE_SIZES):
        path = OUT / f"image_{i}.png"
        make_image(i, w, h).save(path, optimize=False)
        paths.append(path)
    processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    images = [Image.open(p).convert("RGB") for p in paths]
    pixel_values = processor(images=images, return_tensors="pt")["pixel_values"].to(torch.float32)
    assert tuple(pixel_values.shape) == (4, 3, 32, 32)

    head = build_aesthetic_head()
    save_file({k: v.detach().contiguous() for k, v in head.state_dict().items()},
              str(OUT / "aesthetic_head.safetensors"))

    report = {"processor": f"{type(processor).__module__}.{type(processor).__name__}"}
    for name, spec in MODELS.items():
        report[name] = write_model(name, spec, pixel_values, processor,
                                   head if name == "clip_tiny" else None)
    report["tokenizer"] = write_tokenizer(args.bpe)
    for path in OUT.rglob("*"):
        if path.is_file():
            path.chmod(0o644)  # safetensors writes 0600
    print(json.dumps(report, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
