"""OCR fixtures: text pictures and what the reference `rapidocr` package reads on them.

    python scripts/reference_ocr.py --render   # draw the PNGs (DejaVu fonts), then read them
    python scripts/reference_ocr.py            # read the committed PNGs again

Needs `pip install rapidocr==3.10.0 onnxruntime==1.32.0` (the same models and runtime
`scripts/setup-rewards.sh` installs for flowtune). Reading uses rapidocr's defaults without the angle
classifier (`use_cls=False`), as flow_grpo's PaddleOCR reward does. Writes
`crates/rewards/tests/fixtures/ocr/expected.json`: per file, the lines read (text, confidence) in
reading order.
"""

import argparse
import json
import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

OUT = Path(__file__).resolve().parent.parent / "crates/rewards/tests/fixtures/ocr"
FONTS = Path("/usr/share/fonts/truetype/dejavu")

# name, size (w, h), background, lines [(text, font, px, colour, (x, y))], rotation in degrees
PICTURES = [
    ("banner_black_on_white", (320, 96), (255, 255, 255),
     [("HELLO WORLD", "DejaVuSans-Bold.ttf", 36, (0, 0, 0), (20, 28))], 0),
    ("small_serif", (256, 64), (250, 250, 245),
     [("Open 24 hours", "DejaVuSerif.ttf", 18, (20, 20, 20), (30, 20))], 0),
    ("white_on_blue", (384, 128), (30, 60, 160),
     [("COFFEE SHOP", "DejaVuSans-Bold.ttf", 44, (255, 255, 255), (30, 38))], 0),
    ("red_on_yellow_two_lines", (320, 160), (250, 220, 60),
     [("SALE 50%", "DejaVuSans-Bold.ttf", 40, (200, 20, 20), (40, 25)),
      ("today only", "DejaVuSans.ttf", 28, (120, 10, 10), (60, 95))], 0),
    ("rotated_8deg", (384, 192), (240, 240, 240),
     [("Flow Matching", "DejaVuSans.ttf", 36, (10, 10, 10), (50, 70))], 8),
    ("rotated_minus_12deg_mono", (384, 192), (255, 255, 255),
     [("GRPO 2026", "DejaVuSansMono-Bold.ttf", 40, (0, 90, 0), (70, 70))], -12),
    ("gradient_background", (384, 128), None,
     [("Welcome Home", "DejaVuSerif-Bold.ttf", 40, (0, 0, 0), (30, 38))], 0),
    ("large_512", (512, 512), (245, 235, 220),
     [("BAKERY", "DejaVuSans-Bold.ttf", 72, (90, 40, 10), (120, 140)),
      ("fresh bread", "DejaVuSerif-Italic.ttf", 40, (60, 30, 10), (140, 300))], 0),
]


def gradient(size):
    w, h = size
    x = np.linspace(0, 1, w)[None, :, None]
    y = np.linspace(0, 1, h)[:, None, None]
    rgb = np.concatenate([180 + 60 * x + 0 * y, 200 - 40 * y + 0 * x, 120 + 100 * x * y], axis=2)
    return Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB")


def render(name, size, background, lines, rotation):
    canvas = gradient(size) if background is None else Image.new("RGB", size, background)
    if rotation:
        # Draw on a larger canvas of the same background, rotate, crop the middle.
        pad = int(math.hypot(*size))
        big = (gradient((pad, pad)) if background is None
               else Image.new("RGB", (pad, pad), background))
        draw = ImageDraw.Draw(big)
        ox, oy = (pad - size[0]) // 2, (pad - size[1]) // 2
        for text, font, px, colour, (x, y) in lines:
            draw.text((ox + x, oy + y), text, font=ImageFont.truetype(str(FONTS / font), px), fill=colour)
        big = big.rotate(rotation, resample=Image.BICUBIC)
        canvas = big.crop((ox, oy, ox + size[0], oy + size[1]))
    else:
        draw = ImageDraw.Draw(canvas)
        for text, font, px, colour, (x, y) in lines:
            draw.text((x, y), text, font=ImageFont.truetype(str(FONTS / font), px), fill=colour)
    canvas.save(OUT / f"{name}.png", optimize=True)


def render_all():
    OUT.mkdir(parents=True, exist_ok=True)
    for picture in PICTURES:
        render(*picture)
    noise = np.random.default_rng(0).integers(0, 256, size=(128, 128, 3), dtype=np.uint8)
    Image.fromarray(noise, "RGB").save(OUT / "noise.png")


def read_all():
    from rapidocr import RapidOCR

    engine = RapidOCR()
    expected = {}
    for path in sorted(OUT.glob("*.png")):
        out = engine(str(path), use_cls=False)
        txts = list(out.txts) if out.txts is not None else []
        scores = list(out.scores) if out.scores is not None else []
        expected[path.name] = [[t, round(float(s), 4)] for t, s in zip(txts, scores)]
        print(path.name, txts)
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", action="store_true", help="draw the PNGs first")
    if parser.parse_args().render:
        render_all()
    read_all()
