"""Reference pictures for `flowtune_models::resize` (Pillow's Image.resize, exactly).

Usage (any Python with numpy, Pillow and safetensors):
    python scripts/reference_pil_resize.py fixtures/pil_resize.safetensors

Random 8-bit RGB pictures resized up, down and mixed (both pass orders of Pillow 13) with LANCZOS (diffusers' VaeImageProcessor),
BICUBIC (Qwen2-VL's image processor) and BILINEAR (LTX-2's video processor): `<i>.in`, `<i>.out`, `<i>.filter` (0 bicubic,
1 lanczos, 2 bilinear).
"""
import sys

import numpy as np
from PIL import Image
from safetensors.numpy import save_file

CASES = [  # (height, width, new width, new height, filter)
    (37, 53, 80, 48, "lanczos"),
    (200, 131, 64, 96, "lanczos"),
    (30, 20, 90, 61, "lanczos"),
    (33, 47, 33, 20, "lanczos"),
    (50, 80, 56, 84, "bicubic"),
    (120, 90, 28, 56, "bicubic"),
    (40, 60, 59, 38, "bicubic"),
    (320, 480, 476, 308, "bicubic"),
    (320, 480, 476, 320, "bicubic"),
    (320, 480, 480, 308, "bicubic"),
    (32, 480, 476, 32, "bicubic"),
    (50, 50, 49, 45, "lanczos"),  # Pillow 13 resamples the height first here
    (151, 20, 175, 23, "lanczos"),
    (24, 40, 96, 64, "bilinear"),
    (200, 131, 64, 96, "bilinear"),
    (50, 80, 56, 84, "bilinear"),
    (50, 50, 49, 45, "bilinear"),
]
FILTERS = {"bicubic": (Image.BICUBIC, 0), "lanczos": (Image.LANCZOS, 1), "bilinear": (Image.BILINEAR, 2)}


def main(out):
    rng = np.random.default_rng(0)
    tensors = {}
    for i, (h, w, nw, nh, f) in enumerate(CASES):
        a = (rng.random((h, w, 3)) * 255).astype(np.uint8)
        resample, code = FILTERS[f]
        tensors[f"{i}.in"] = a
        tensors[f"{i}.out"] = np.asarray(Image.fromarray(a).resize((nw, nh), resample=resample)).copy()
        tensors[f"{i}.filter"] = np.array([code], dtype=np.int64)
    save_file(tensors, out)
    print(f"wrote {out}: {len(CASES)} cases")


if __name__ == "__main__":
    main(sys.argv[1])
