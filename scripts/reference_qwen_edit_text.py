"""Qwen-Image-Edit-Plus prompt-encoding fixtures: Qwen2.5-VL's language model on text with condition
pictures (3-D multimodal RoPE positions) and `QwenImageEditPlusPipeline._get_qwen_prompt_embeds`.

    /root/.cache/flowtune/venv/bin/python scripts/reference_qwen_edit_text.py

Needs torch, transformers (5.x), diffusers (0.42), Pillow and safetensors; no GPU, no network.
Deterministic. Reuses `fixtures/qwen_image_pipeline/{text_encoder,tokenizer}` (the tiny Qwen-Image
pipeline, whose text encoder has a vision tower) and `fixtures/qwen_vision_processor/` (small pixel
bounds). Writes `fixtures/qwen_edit_text_io.safetensors`:

- `pictures.<name>` (H, W, 3) u8: the condition pictures, already at their condition size.
- `lm.input_ids` / `lm.attention_mask` (2, L) i64 (right padding) from `Qwen2VLProcessor` for two
  texts with one picture each, `lm.image_embeds` the vision tower's merged embeddings for them,
  `lm.image_grid_thw`, `lm.position_ids` (3, 2, L) from `get_rope_index`, and
  `lm.hidden_states` = `hidden_states[-1]` with those 3-D positions.
- `edit.<case>.embeds` / `.mask` (1, L, D) / (1, L) from `_get_qwen_prompt_embeds` with the 3-D
  positions, for the prompt and pictures of `EDIT_CASES` (`none`: no picture, text only).

diffusers 0.42 does not pass `mm_token_type_ids` to the text encoder, and transformers 5 only
computes 3-D positions when it gets them, so the pipeline as shipped gives image tokens sequential
1-D positions (transformers 4.x, which Qwen-Image-Edit-Plus was released with, derived the 3-D
positions from `input_ids`). The fixtures follow the model: the text encoder is wrapped to pass
`mm_token_type_ids`; the difference to the shipped behaviour is printed.
"""

from pathlib import Path

import numpy as np
import torch
from diffusers import QwenImageEditPlusPipeline
from PIL import Image
from safetensors.torch import save_file
from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer, Qwen2VLProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures"
PIPELINE = FIX / "qwen_image_pipeline"
# (height, width): 56×56 → a 2×2 merged grid; 50×100 → 28×84 → 1×3.
PICTURES = {"square": (70, 100), "wide": (50, 100)}
EDIT_CASES = {
    "one": ("make the cat red", ["square"]),
    "two": ("put the dog from picture 2 next to the cat", ["square", "wide"]),
    "none": ("a cat", []),
}
LM_TEXTS = [
    "a photo <|vision_start|><|image_pad|><|vision_end|> of a cat on a mat",
    "<|vision_start|><|image_pad|><|vision_end|> dog",
]


class ImageOnlyProcessor(Qwen2VLProcessor):
    """`Qwen2VLProcessor` without a video processor (that needs torchvision, absent from the venv)."""

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "video_processor" and argument is None:
            return None
        return super().check_argument_for_proper_class(argument_name, argument)


class WithTokenTypes:
    """The text encoder, called with `mm_token_type_ids` (1 at image tokens) as the model expects."""

    def __init__(self, model):
        self.model = model
        self.dtype = model.dtype

    def __call__(self, input_ids, **kwargs):
        types_ = (input_ids == self.model.config.image_token_id).int()
        return self.model(input_ids=input_ids, mm_token_type_ids=types_, **kwargs)


def pictures() -> dict:
    gen = np.random.default_rng(11)
    out = {}
    for name, (h, w) in PICTURES.items():
        # smooth gradients plus noise, so resampling has something to do
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack([xx * 255 / w, yy * 255 / h, (xx + yy) * 127 / (h + w)], -1)
        out[name] = np.clip(base + gen.normal(0, 30, (h, w, 3)), 0, 255).astype(np.uint8)
    return out


def pipeline(text_encoder, tokenizer, processor):
    """The Edit-Plus pipeline with only its prompt-encoding parts."""
    pipe = QwenImageEditPlusPipeline(
        scheduler=None, vae=None, text_encoder=None, tokenizer=tokenizer, processor=processor,
        transformer=None,
    )
    assert pipe.prompt_template_encode_start_idx == 64
    # set after registration: the wrapper is not a module diffusers could register
    object.__setattr__(pipe, "text_encoder", text_encoder)
    return pipe


def main():
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(PIPELINE / "text_encoder").eval()
    tokenizer = Qwen2Tokenizer.from_pretrained(PIPELINE / "tokenizer")
    image_processor = Qwen2VLImageProcessorPil.from_pretrained(FIX / "qwen_vision_processor")
    processor = ImageOnlyProcessor(image_processor=image_processor, tokenizer=tokenizer)
    assert tokenizer.convert_tokens_to_ids("<|image_pad|>") == model.config.image_token_id
    pics = pictures()
    tensors = {f"pictures.{k}": torch.from_numpy(v) for k, v in pics.items()}

    inputs = processor(
        text=LM_TEXTS,
        images=[Image.fromarray(pics["square"]), Image.fromarray(pics["wide"])],
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        grid = inputs["image_grid_thw"]
        embeds = model.model.visual(inputs["pixel_values"], grid_thw=grid).pooler_output
        positions, _ = model.model.get_rope_index(
            inputs["input_ids"],
            mm_token_type_ids=inputs["mm_token_type_ids"],
            image_grid_thw=grid,
            attention_mask=inputs["attention_mask"],
        )
        out = model(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            pixel_values=inputs["pixel_values"],
            image_grid_thw=grid,
            mm_token_type_ids=inputs["mm_token_type_ids"],
            output_hidden_states=True,
        )
    tensors.update({
        "lm.input_ids": inputs["input_ids"].long(),
        "lm.attention_mask": inputs["attention_mask"].long(),
        "lm.image_embeds": embeds,
        "lm.image_grid_thw": grid.long(),
        "lm.position_ids": positions.long(),
        "lm.hidden_states": out.hidden_states[-1],
    })
    print(f"lm: ids {tuple(inputs['input_ids'].shape)} grids {grid.tolist()}")

    mrope = pipeline(WithTokenTypes(model), tokenizer, processor)
    shipped = pipeline(model, tokenizer, processor)
    for case, (prompt, names) in EDIT_CASES.items():
        images = [Image.fromarray(pics[n]) for n in names] or None
        with torch.no_grad():
            embeds, mask = mrope._get_qwen_prompt_embeds(prompt, images)
            plain, _ = shipped._get_qwen_prompt_embeds(prompt, images)
        tensors[f"edit.{case}.embeds"] = embeds
        tensors[f"edit.{case}.mask"] = mask.long()
        diff = (embeds - plain).abs().max().item()
        print(f"edit.{case}: {tuple(embeds.shape)}, max |3-D − shipped 1-D positions| {diff:.3e}")
    save_file({k: v.contiguous() for k, v in tensors.items()}, FIX / "qwen_edit_text_io.safetensors")


if __name__ == "__main__":
    main()
