"""Reference trajectory for Qwen-Image-Edit-Plus: diffusers' QwenImageEditPlusPipeline components
in a loop written here, with condition pictures (resized by the pipeline's own image processor,
through the vision tower with the prompt, VAE-encoded and packed onto the image stream), true CFG
with the same pictures on the negative side, the SDE window and given noise.

Usage (the project's reference venv):
    flowtune make-tiny qwen-image fixtures/qwen_image_edit_pipeline --edit --zero-cond-t
    python scripts/reference_qwen_edit_rollout.py fixtures/qwen_image_edit_pipeline \
        fixtures/qwen_image_edit_rollout_io.safetensors [flowtune]

As `scripts/reference_qwen_edit_text.py` explains, the text encoder is called with
`mm_token_type_ids` so that image tokens get Qwen2.5-VL's 3-D positions (diffusers 0.42 with
transformers 5 would give them 1-D ones). Writes `input.picture_<i>` (H, W, 3) u8 besides the
tensors of `reference_qwen_rollout.py`; with a flowtune binary it runs `flowtune debug rollout
--images` on the same inputs and prints the differences.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

sys.path.insert(0, os.path.dirname(__file__))
from reference_qwen_edit_text import ImageOnlyProcessor, WithTokenTypes  # noqa: E402
from reference_qwen_rollout import denoise, pack  # noqa: E402

PROMPTS = ["make the square red"]  # diffusers takes one prompt at a time
SPEC = dict(steps=4, guidance_scale=4.0, noise_level=0.7, window_start=1, window_size=2, height=32, width=48)
PICTURE = (60, 90)  # height, width of the condition picture


def picture():
    h, w = PICTURE
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 / w, yy * 255 / h, (xx + yy) * 127 / (h + w)], -1)
    noise = np.random.default_rng(5).normal(0, 25, (h, w, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def main(pipeline_dir, out, flowtune=None):
    from diffusers import QwenImageEditPlusPipeline
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import CONDITION_IMAGE_SIZE, VAE_IMAGE_SIZE, calculate_dimensions

    tokenizer = Qwen2Tokenizer.from_pretrained(os.path.join(pipeline_dir, "tokenizer"))
    processor = ImageOnlyProcessor(
        image_processor=Qwen2VLImageProcessorPil.from_pretrained(os.path.join(pipeline_dir, "processor")),
        tokenizer=tokenizer,
    )
    pipe = QwenImageEditPlusPipeline.from_pretrained(pipeline_dir, processor=processor)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(os.path.join(pipeline_dir, "text_encoder")).eval()
    object.__setattr__(pipe, "text_encoder", WithTokenTypes(model))

    s = SPEC
    b = len(PROMPTS)
    f = pipe.vae_scale_factor
    h, w = s["height"] // f, s["width"] // f
    pic = Image.fromarray(picture())
    g = torch.Generator().manual_seed(9)
    x = torch.randn(b, 16, h, w, generator=g)
    step_noise = torch.randn(s["steps"], b, 16, h, w, generator=g)
    io = {"input.initial_latents": x.clone(), "input.step_noise": step_noise, "input.picture_0": torch.from_numpy(np.asarray(pic).copy())}

    with torch.no_grad():
        cw, ch = calculate_dimensions(CONDITION_IMAGE_SIZE, pic.width / pic.height)
        vw, vh = calculate_dimensions(VAE_IMAGE_SIZE, pic.width / pic.height)
        condition = pipe.image_processor.resize(pic, ch, cw)
        vae_image = pipe.image_processor.preprocess(pic, vh, vw).unsqueeze(2)
        pe, pm = pipe.encode_prompt(image=[condition], prompt=PROMPTS, device="cpu")
        ne, nm = pipe.encode_prompt(image=[condition], prompt=[" "] * b, device="cpu")
        pm = torch.ones(pe.shape[:2], dtype=torch.int64) if pm is None else pm
        nm = torch.ones(ne.shape[:2], dtype=torch.int64) if nm is None else nm
        _, image_latents = pipe.prepare_latents([vae_image], b, 16, s["height"], s["width"], torch.float32, "cpu", None, pack(x))
        io["output.prompt_embeds"] = pe
        io["output.negative_prompt_embeds"] = ne
        io["output.condition_latents"] = image_latents
        img_shapes = [[(1, h // 2, w // 2), (1, vh // f // 2, vw // f // 2)]] * b
        _, recorded, _ = denoise(pipe, s, x, step_noise, (pe, pm), (ne, nm), img_shapes, image_latents)
    io.update(recorded)
    save_file({k: v.contiguous() for k, v in io.items()}, out)
    print(f"wrote {out}: {s}, condition {cw}×{ch}, VAE {vw}×{vh}, prompt tokens {pe.shape[1]}")

    if flowtune:
        with tempfile.TemporaryDirectory() as tmp:
            with open(f"{tmp}/prompts.txt", "w") as fh:
                fh.write("\n".join(PROMPTS) + "\n")
            pic.save(f"{tmp}/picture.png")
            save_file({"initial_latents": x, "step_noise": step_noise}, f"{tmp}/noise.safetensors")
            subprocess.run([flowtune, "debug", "rollout", "--model", pipeline_dir, "--prompts", f"{tmp}/prompts.txt",
                            "--noise", f"{tmp}/noise.safetensors", "--out", f"{tmp}/out.safetensors",
                            "--steps", str(s["steps"]), "--guidance", str(s["guidance_scale"]),
                            "--noise-level", str(s["noise_level"]), "--window-start", str(s["window_start"]),
                            "--window-size", str(s["window_size"]), "--images", f"{tmp}/picture.png"], check=True)
            ours = load_file(f"{tmp}/out.safetensors")
        worst = 0.0
        for k in ["all_latents", "all_log_probs", "all_timesteps", "final_latents"]:
            ref = io[f"output.{k}"]
            rel = ((ours[k] - ref).norm() / ref.norm()).item()
            worst = max(worst, rel)
            print(f"debug rollout {k}: relative difference {rel:.2e}")
        sys.exit(0 if worst < 1e-3 else 1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
