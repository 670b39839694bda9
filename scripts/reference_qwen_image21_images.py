"""Reference fixtures for Qwen-Image 2.1's condition images (diffusers 0.42.1 `QwenImage21Pipeline(image=...)` and
transformers' Qwen3-VL vision tower, deepstack and interleaved multimodal rotary positions).

Usage (the project's reference venv: torch, torchvision, diffusers 0.42.1, transformers 5):
    python scripts/reference_qwen_image21_images.py fixtures

Run it after `reference_qwen_image21.py` (it loads `qwen_image21_pipeline/`, whose Qwen3VLForConditionalGeneration
already carries a random vision tower). Writes:

- `qwen3_vl_tiny/`: a random Qwen3VLForConditionalGeneration made by transformers (a three-block vision tower with
  4-pixel patches, a 3 x 3 learned position table, deepstack mergers after blocks 0 and 2; a three-layer language
  model with interleaved multimodal rotary sections [4, 2, 2]), and `qwen3_vl_tiny_io.safetensors`: `pixel_values`
  and `image_grid_thw` of three non-square patch grids, the tower's merged output (`output.image_embeds`) and
  deepstack features (`output.deepstack.K`), and two left-padded rows of different lengths (`input.input_ids`,
  `input.attention_mask`, `input.mm_token_type_ids`: the first row holds two pictures, the second one) with the
  last layer's states before the final norm (`output.last_layer`), as the pipeline's hook reads them.
- `qwen_image21_images_io.safetensors`: u8 RGB pictures (`input.picture_a` 90 x 60, `input.picture_b` 36 x 60,
  `input.picture_c` 50 x 42, W x H), the pipeline's `encode_prompt` of the two prompts of different lengths with
  picture a (`output.one_*`) and with a and b (`output.two_*`) after `__call__`'s resizing at output resolution 96
  (`embeds`, `mask` when padded, `image_pad_mask`), and two whole ODE runs of `__call__` with given latents
  (`ode2_*`: pictures a and b, a 96 x 96 target at output resolution 96, CFG 4 against the empty prompt;
  `ode1_*`: picture c, a 32 x 128 target at output resolution 64, no guidance): initial and final latents, the
  sigmas and the decoded pictures (RGB, u8 levels). Then an RGBA picture (`input.picture_rgba`, 60 x 44, alpha from
  0 through a ramp to 255): Pillow's resize of it at output resolution 64 (`output.rgba_resized`), that composited
  over white (`output.rgba_over_white`), and an ODE run on a 64 x 64 target without guidance (`rgba_*`). Last,
  picture c on a 64 x 64 target at output resolution 96, without guidance (`res96_*`).
"""
import sys

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file

from transformer_fixtures import randomize_

PROMPTS = ["a red circle next to a blue square",
           "一只猫坐在垫子上, \"OPEN\" 24/7, with a longer caption than the first prompt has"]
IMAGE, VIDEO, START, END = 60, 61, 58, 59


def tower_case(out_dir, g):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    config = Qwen3VLConfig(
        text_config=dict(vocab_size=64, hidden_size=24, intermediate_size=40, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=512,
                         rope_parameters=dict(rope_type="default", rope_theta=5e6, mrope_section=[4, 2, 2],
                                              mrope_interleaved=True)),
        vision_config=dict(depth=3, hidden_size=16, intermediate_size=24, num_heads=2, out_hidden_size=24,
                           patch_size=4, spatial_merge_size=2, temporal_patch_size=2,
                           deepstack_visual_indexes=[0, 2], num_position_embeddings=9),
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END,
        tie_word_embeddings=False)
    model = Qwen3VLForConditionalGeneration(config).eval()
    randomize_(model, g, scale=0.2)
    model.save_pretrained(f"{out_dir}/qwen3_vl_tiny")

    grids = torch.tensor([[1, 4, 6], [1, 6, 2], [1, 2, 4]])
    patch_dim = 3 * 2 * 4 * 4
    pixel_values = torch.randn(int(grids.prod(-1).sum()), patch_dim, generator=g)
    tokens = (grids.prod(-1) // 4).tolist()

    def picture(n):
        return [START] + [IMAGE] * n + [END]

    rows = [[1, 2, 3, 4, 5] + picture(tokens[0]) + [6, 7, 8] + picture(tokens[1]) + [9, 10, 11, 12],
            [13, 14] + picture(tokens[2]) + [15, 16, 17, 18, 19, 20, 21]]
    length = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (length - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (length - len(r)) + [1] * len(r) for r in rows])
    types = (ids == IMAGE).to(torch.int32)
    io = {"input.pixel_values": pixel_values, "input.image_grid_thw": grids, "input.input_ids": ids,
          "input.attention_mask": mask, "input.mm_token_type_ids": types}
    with torch.no_grad():
        vision = model.model.visual(pixel_values, grid_thw=grids, return_dict=True)
        io["output.image_embeds"] = vision.pooler_output
        for k, feature in enumerate(vision.deepstack_features):
            io[f"output.deepstack.{k}"] = feature
        text_model = model.model.language_model
        handle = text_model.norm.register_forward_hook(lambda module, args, output: args[0])
        try:
            out = model(input_ids=ids, attention_mask=mask, pixel_values=pixel_values, image_grid_thw=grids,
                        mm_token_type_ids=types, output_hidden_states=True)
        finally:
            handle.remove()
        io["output.last_layer"] = out.hidden_states[-1]
    save_file({k: v.contiguous() for k, v in io.items()}, f"{out_dir}/qwen3_vl_tiny_io.safetensors")
    print("tower: embeds", tuple(io["output.image_embeds"].shape), "states", tuple(io["output.last_layer"].shape))


def smooth_picture(g, width, height):
    """A u8 RGB picture with structure at several scales (so resampling filters matter)."""
    coarse = torch.rand(1, 3, 5, 7, generator=g)
    x = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bicubic", align_corners=False)[0]
    x = x + 0.15 * torch.randn(3, height, width, generator=g)
    return (x.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous()


def resized(pipe, picture, resolution):
    """`__call__`'s resize of one condition picture at `output_resolution`."""
    from diffusers.pipelines.qwenimage21.pipeline_qwenimage21 import calculate_dimensions

    img = Image.fromarray(picture.numpy()).convert("RGBA")  # u8 H x W x 3 or 4
    w, h, _ = calculate_dimensions(resolution * resolution, img.size[0] / img.size[1])
    return pipe.image_processor.resize(img, width=w, height=h)


def pipeline_case(out_dir, g):
    from diffusers import QwenImage21Pipeline

    pipe = QwenImage21Pipeline.from_pretrained(f"{out_dir}/qwen_image21_pipeline")
    pictures = {"a": smooth_picture(g, 90, 60), "b": smooth_picture(g, 36, 60), "c": smooth_picture(g, 50, 42)}
    io = {f"input.picture_{k}": v for k, v in pictures.items()}
    with torch.no_grad():
        for name, keys in [("one", "a"), ("two", "ab")]:
            images = [resized(pipe, pictures[k], 96) for k in keys]
            embeds, mask, slots = pipe.encode_prompt(list(PROMPTS), image=images, device="cpu")
            io[f"output.{name}_embeds"] = embeds
            if mask is not None:
                io[f"output.{name}_mask"] = mask.to(torch.int64)
            io[f"output.{name}_image_pad_mask"] = slots.to(torch.int64)
            print(name, "embeds", tuple(embeds.shape), "slots", int(slots[0].sum()), [i.size for i in images])
    runs = [("ode2", "ab", 96, 96, 96, 4.0), ("ode1", "c", 32, 128, 64, 1.0)]
    for name, keys, h, w, resolution, cfg in runs:
        x = torch.randn(len(PROMPTS), pipe.transformer.config.in_channels, h // 16, w // 16, generator=g)
        io[f"input.{name}_initial_latents"] = x
        final = {}

        def keep(pipe_, i, t, kwargs):
            final["latents"] = kwargs["latents"]
            return {}

        extra = dict(negative_prompt=[""] * len(PROMPTS), true_cfg_scale=cfg) if cfg > 1 else {}
        images = pipe(prompt=list(PROMPTS), image=[Image.fromarray(pictures[k].numpy()) for k in keys], height=h,
                      width=w, output_resolution=resolution, latents=x.flatten(2).transpose(1, 2).clone(),
                      output_type="np", callback_on_step_end=keep, **extra).images
        io[f"output.{name}_final_latents"] = final["latents"].transpose(1, 2).reshape(x.shape)
        io[f"output.{name}_images"] = (torch.from_numpy(np.ascontiguousarray(images[..., :3])) * 255).round().to(
            torch.uint8)
        io[f"output.{name}_sigmas"] = pipe.scheduler.sigmas.clone()
        print(name, "images", images.shape, "sigmas", [round(float(v), 4) for v in pipe.scheduler.sigmas])
    # An RGBA picture (transparent, translucent and opaque areas): the encoder sees it over white, the VAE with alpha.
    rgba = torch.cat([smooth_picture(g, 60, 44), alpha_ramp(60, 44)], dim=2)
    io["input.picture_rgba"] = rgba
    sized = resized(pipe, rgba, 64)
    io["output.rgba_resized"] = torch.from_numpy(np.asarray(sized).copy())
    white = Image.new("RGB", sized.size, (255, 255, 255))
    white.paste(sized, mask=sized.getchannel("A"))
    io["output.rgba_over_white"] = torch.from_numpy(np.asarray(white).copy())
    x = torch.randn(len(PROMPTS), pipe.transformer.config.in_channels, 4, 4, generator=g)
    io["input.rgba_initial_latents"] = x
    final = {}

    def keep_rgba(pipe_, i, t, kwargs):
        final["latents"] = kwargs["latents"]
        return {}

    images = pipe(prompt=list(PROMPTS), image=Image.fromarray(rgba.numpy(), "RGBA"), height=64, width=64,
                  output_resolution=64, latents=x.flatten(2).transpose(1, 2).clone(), output_type="np",
                  callback_on_step_end=keep_rgba).images
    io["output.rgba_final_latents"] = final["latents"].transpose(1, 2).reshape(x.shape)
    io["output.rgba_images"] = (torch.from_numpy(np.ascontiguousarray(images[..., :3])) * 255).round().to(torch.uint8)
    io["output.rgba_sigmas"] = pipe.scheduler.sigmas.clone()
    print("rgba: resized", sized.size, "images", images.shape)
    # Picture c on a 64 x 64 target at output resolution 96: the picture is sized by that, not by the target.
    x = torch.randn(len(PROMPTS), pipe.transformer.config.in_channels, 4, 4, generator=g)
    io["input.res96_initial_latents"] = x
    images = pipe(prompt=list(PROMPTS), image=Image.fromarray(pictures["c"].numpy()), height=64, width=64,
                  output_resolution=96, latents=x.flatten(2).transpose(1, 2).clone(), output_type="np",
                  callback_on_step_end=keep_rgba).images
    io["output.res96_final_latents"] = final["latents"].transpose(1, 2).reshape(x.shape)
    io["output.res96_images"] = (torch.from_numpy(np.ascontiguousarray(images[..., :3])) * 255).round().to(
        torch.uint8)
    io["output.res96_sigmas"] = pipe.scheduler.sigmas.clone()
    save_file({k: v.contiguous() for k, v in io.items()}, f"{out_dir}/qwen_image21_images_io.safetensors")


def alpha_ramp(width, height):
    """An alpha channel: transparent on the left, a ramp through translucent values, opaque on the right."""
    ramp = (torch.arange(width, dtype=torch.float32) - width / 4) / (width / 2)
    row = (ramp.clamp(0, 1) * 255).round().to(torch.uint8)
    return row.view(1, width, 1).expand(height, width, 1).contiguous()


def main(out_dir):
    torch.manual_seed(0)
    tower_case(out_dir, torch.Generator().manual_seed(20261130))
    pipeline_case(out_dir, torch.Generator().manual_seed(20261131))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fixtures")
