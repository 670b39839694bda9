"""Fixtures of a Qwen2-VL preference model as HPSv3 builds and runs one (`Qwen2VLRewardModelBT`: a Qwen2-VL backbone
and `rm_head`, Linear(hidden, 1024) → ReLU → Dropout → Linear(1024, 16) → ReLU → Linear(16, 2), read at the
`<|Reward|>` token after the final norm, every token at sequential positions, rows padded on the right).

    $FLOWTUNE_VENV/bin/python scripts/reference_preference_model.py       # PYTHONPATH=$FLOWTUNE_CACHE/anchors

Needs torch, transformers (5.x), Pillow and safetensors; deterministic. The head and forward are written here from
HPSv3's published architecture (its class subclasses transformers' `Qwen2VLForConditionalGeneration`). Writes into
`fixtures/`:
- `preference_qwen2vl_tiny/`: a tiny random `Qwen2VLForConditionalGeneration` with `rm_head.*` in its safetensors, the
  tiny Qwen2 tokenizer with `<|Reward|>` added, a Qwen2-VL image processor config with min = max pixels (as HPSv3
  fixes them) and Qwen2-VL's chat template;
- `preference_io.safetensors`: `scores` (4, 2) f32 of the four pictures of `reference_vlm_judge.py` with
  `preference.json`'s `user` texts (`input_ids`, `attention_mask` of the right-padded batch too), and the vision
  tower's merged embeddings `image_embeds` of their `pixel_values` / `image_grid_thw`.
"""

import json
import shutil
import sys
from pathlib import Path

import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoTokenizer, Qwen2VLConfig, Qwen2VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_vlm_judge import IDS, PAD, QWEN25_TEMPLATE, messages, pictures  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures"
FOLDER = FIX / "preference_qwen2vl_tiny"
PROMPTS = ["a red kite", "the word OPEN", "two cats on a mat", "a blue door at night"]
USER = "Rate the picture for: {}\nPlease provide the overall ratings of this image: <|Reward|>\n\nEND\n"
PIXELS = 28 * 28 * 9


def head(hidden: int, outputs: int = 2) -> nn.Sequential:
    return nn.Sequential(nn.Linear(hidden, 1024), nn.ReLU(), nn.Dropout(0.05), nn.Linear(1024, 16), nn.ReLU(),
                         nn.Linear(16, outputs))


def build():
    torch.manual_seed(41)
    text = dict(vocab_size=480, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=452, pad_token_id=PAD,
                rope_parameters=dict(rope_type="default", rope_theta=1e6, mrope_section=[2, 1, 1]))
    vision = dict(depth=2, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    cfg = Qwen2VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **IDS)
    model = Qwen2VLForConditionalGeneration(cfg).eval()
    rm_head = head(32).eval()
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(rm_head.named_parameters()):
            if "norm" in name or "ln_q" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.25 * torch.randn_like(p))
    if FOLDER.exists():
        shutil.rmtree(FOLDER)
    model.save_pretrained(FOLDER)
    (FOLDER / "generation_config.json").unlink(missing_ok=True)
    file = FOLDER / "model.safetensors"
    tensors = load_file(file)
    tensors.update({f"rm_head.{k}": v.contiguous() for k, v in rm_head.state_dict().items()})
    save_file(tensors, file, metadata={"format": "pt"})
    tokenizer = AutoTokenizer.from_pretrained(FIX / "qwen_text_tiny_tokenizer")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|Reward|>"]})
    tokenizer.save_pretrained(FOLDER)
    (FOLDER / "chat_template.json").write_text(json.dumps({"chat_template": QWEN25_TEMPLATE}, indent=2) + "\n")
    processor = Qwen2VLImageProcessorPil(min_pixels=PIXELS, max_pixels=PIXELS)
    config = {k: v for k, v in sorted(processor.to_dict().items()) if not k.startswith("_")}
    config["min_pixels"], config["max_pixels"] = PIXELS, PIXELS
    config["image_processor_type"] = "Qwen2VLImageProcessor"
    (FOLDER / "preprocessor_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return model, rm_head


def main():
    model, rm_head = build()
    model = Qwen2VLForConditionalGeneration.from_pretrained(FOLDER).eval()
    stored = load_file(FOLDER / "model.safetensors")
    rm_head.load_state_dict({k[len("rm_head."):]: v for k, v in stored.items() if k.startswith("rm_head.")})
    tokenizer = AutoTokenizer.from_pretrained(FOLDER)
    tokenizer.chat_template = QWEN25_TEMPLATE
    processor = Qwen2VLImageProcessorPil.from_pretrained(FOLDER)
    reward = tokenizer.convert_tokens_to_ids("<|Reward|>")
    users = [USER.format(p) for p in PROMPTS]
    texts = [tokenizer.apply_chat_template(messages(None, u), tokenize=False, add_generation_prompt=True)
             for u in users]
    images = processor(images=[Image.fromarray(p) for p in pictures()], return_tensors="pt")
    ids = []
    for text, grid in zip(texts, images["image_grid_thw"]):
        ids.append(tokenizer(text.replace("<|image_pad|>", "<|image_pad|>" * int(grid.prod() // 4)),
                             add_special_tokens=False)["input_ids"])
    longest = max(len(r) for r in ids)
    input_ids = torch.tensor([r + [PAD] * (longest - len(r)) for r in ids])
    mask = torch.tensor([[1] * len(r) + [0] * (longest - len(r)) for r in ids])
    with torch.no_grad():
        x = model.get_input_embeddings()(input_ids)
        embeds = model.model.get_image_features(images["pixel_values"], images["image_grid_thw"]).pooler_output
        embeds = torch.cat(embeds, 0) if isinstance(embeds, (list, tuple)) else embeds
        slots = (input_ids == model.config.image_token_id).unsqueeze(-1).expand_as(x)
        x = x.masked_scatter(slots, embeds.to(x.dtype))
        hidden = model.model.language_model(inputs_embeds=x, attention_mask=mask)[0]
        logits = rm_head(hidden.float())
        scores = logits[input_ids == reward].view(len(ids), -1)
    print("scores", scores.tolist())
    save_file({"scores": scores.contiguous(), "input_ids": input_ids, "attention_mask": mask,
               "pixel_values": images["pixel_values"].contiguous(), "image_grid_thw": images["image_grid_thw"],
               "image_embeds": embeds.contiguous()}, FIX / "preference_io.safetensors")
    (FIX / "preference.json").write_text(json.dumps({"model": FOLDER.name, "user": users, "prompts": PROMPTS,
                                                    "params": sum(p.numel() for p in model.parameters())
                                                    + sum(p.numel() for p in rm_head.parameters())},
                                                   indent=1) + "\n")


if __name__ == "__main__":
    main()
