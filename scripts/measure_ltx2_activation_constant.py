"""The activation constant c of LTX-2's joint block for `flowtune plan` (crates/plan/src/denoisers.rs,
`c::LTX2`), measured as scripts/measure_activation_constants.py measures the others: the shipped
LTX-2.3 transformer config at reduced width (4 video heads of 128, 4 audio heads of 64: the real
2:1 ratio of the streams' widths), 1 and 2 blocks, bytes autograd saves in one forward (parameters
excluded, weights requiring gradients as under LoRA); c is the difference over S_v·h + S_a·h_a,
the block's tokens weighted by their stream's width. A second run with twice the audio tokens
gives the audio stream's own c_a (and so the video stream's c_v).

Usage (torch and diffusers 0.42.1):
    python scripts/measure_ltx2_activation_constant.py [--side 32 --frames 2 --audio 64 --text-len 64 --device cpu]
"""
import argparse
import os
import sys

import torch
from diffusers import LTX2VideoTransformer3DModel

sys.path.insert(0, os.path.dirname(__file__))
from measure_activation_constants import saved_bytes, shipped  # noqa: E402

HEADS = 4


def build(blocks, audio, a, folder):
    c = shipped(folder)
    h, ha = HEADS * c["attention_head_dim"], HEADS * c["audio_attention_head_dim"]
    c.update(num_layers=blocks, num_attention_heads=HEADS, audio_num_attention_heads=HEADS,
             cross_attention_dim=h, audio_cross_attention_dim=ha, caption_channels=h)
    m = LTX2VideoTransformer3DModel(**c)
    video = a.frames * a.side * a.side
    t = torch.full((1,), 500.0)
    args = dict(hidden_states=torch.randn(1, video, c["in_channels"]),
                audio_hidden_states=torch.randn(1, audio, c["audio_in_channels"]),
                encoder_hidden_states=torch.randn(1, a.text_len, h),
                audio_encoder_hidden_states=torch.randn(1, a.text_len, ha),
                timestep=t, sigma=t / 1000, audio_sigma=t / 1000,
                num_frames=a.frames, height=a.side, width=a.side, audio_num_frames=audio)
    return m, args, h, ha, video


def saved(blocks, audio, a, dtype, folder):
    torch.manual_seed(0)
    m, args, h, ha, video = build(blocks, audio, a, folder)
    m = m.to(a.device, dtype)
    return saved_bytes(m, args, dtype), h, ha, video


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", type=int, default=32, help="latent side (one token per latent cell)")
    ap.add_argument("--frames", type=int, default=2, help="latent frames")
    ap.add_argument("--audio", type=int, default=64, help="audio tokens")
    ap.add_argument("--text-len", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="ltx-2.3", help="folder under examples/models")
    a = ap.parse_args()
    torch.set_grad_enabled(True)
    print("| dtype | c (joint) | c_v | c_a |")
    print("|---|---|---|---|")
    for dtype in (torch.bfloat16, torch.float32):
        block = {}
        for audio in (a.audio, 2 * a.audio):
            (one, h, ha, video), (two, *_) = (saved(b, audio, a, dtype, a.model) for b in (1, 2))
            block[audio] = two - one
        c_a = (block[2 * a.audio] - block[a.audio]) / (a.audio * ha)
        c_v = (block[a.audio] - c_a * a.audio * ha) / (video * h)
        joint = block[a.audio] / (video * h + a.audio * ha)
        print(f"| {dtype} | {joint:.1f} | {c_v:.1f} | {c_a:.1f} |", flush=True)


if __name__ == "__main__":
    main()
