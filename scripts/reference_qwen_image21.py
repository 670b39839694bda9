"""Reference fixtures for Qwen-Image 2.1 (diffusers' QwenImage21Transformer2DModel).

Usage (the project's reference venv: torch, diffusers 0.42.1, transformers, peft):
    python scripts/reference_qwen_image21.py fixtures

Writes, for each tiny random transformer config below, `<name>/`, `<name>_lora.safetensors` and
`<name>_io.safetensors` (`input.*` as diffusers' forward takes them: `hidden_states` (condition-image tokens, then the
target's), `encoder_hidden_states` (the encoder's sequence, condition-image slots included), `timestep` as sigma,
`img_shapes` (n_images, 3), `img_mask` (B, L + target/4) and `encoder_hidden_states_mask` (B, L) as int64 0/1 (the
latter absent when nothing is padded); outputs, LoRA outputs and gradients as `transformer_fixtures.lora_case` writes
them), and updates the entries of kind `qwen_image21_transformer` in `manifest.json`.

It also writes `qwen_image21_vae/` (a tiny random AutoencoderKLQwenImage21: the real five-level residual layout at
widths 8 / 12, z_dim 16, RGBA) and `qwen_image21_vae_io.safetensors`: u8 RGBA pictures (`input.pixels`, B x H x W x 4),
their latents as the pipeline's own `_encode_vae_image` returns them (`output.encoded_latents`), and latents
(`input.decode_latents`) decoded as `QwenImage21Pipeline.__call__` decodes them (`output.decoded`, B x 4 x H x W).

Finally `qwen_image21_pipeline/`: a tiny QwenImage21Pipeline saved by diffusers (a random transformer, that VAE, a random
Qwen3VLForConditionalGeneration, a Qwen3VLProcessor on the tiny Qwen2 tokenizer of `qwen_image_pipeline/tokenizer`
with a minimal chat template, author-set `sample_sigmas`), and `qwen_image21_pipeline_io.safetensors`: the pipeline's
`encode_prompt` of prompts of different lengths and of the empty negative prompt (embeds, masks), and a whole ODE
sampling run of `__call__` with given latents (CFG 4 against the empty prompt, KV cache on as by default): the sigmas,
the final latents (from the step callback) and the pictures.
"""
import sys
import types

import numpy as np
import torch
from safetensors.torch import save_file

from transformer_fixtures import lora_case, randomize_, update_manifest

TARGETS = ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "img_mlp.proj", "img_mlp.gate_layer",
           "img_mlp.out"]

# `layout`: the encoder's sequence as runs of text tokens (int) and condition images ((h, w) latent tokens, one slot
# per 2 x 2 of them); `valid`: each row's valid text length (None: nothing padded, no mask).
CONFIGS = [
    {
        "name": "qwen_image21_tiny",
        "config": dict(num_layers=2, num_attention_heads=2, attention_head_dim=16, axes_dims_rope=(4, 6, 6),
                       context_in_dim=24, in_channels=16, out_channels=16, mlp_ratio=3, causal_condition=True),
        # Text, one non-square condition image, text; a 4 x 6 target; the first row's last two tokens padded.
        "layout": [5, (2, 4), 4],
        "target": (4, 6),
        "valid": [7, 9],
        "timesteps": [0.999, 0.3125],
        "lora": {"r": 4, "alpha": 8, "targets": TARGETS},
    },
    {
        "name": "qwen_image21_t2i",
        "config": dict(num_layers=1, num_attention_heads=3, attention_head_dim=8, axes_dims_rope=(2, 2, 4),
                       context_in_dim=20, in_channels=12, out_channels=12, mlp_ratio=2, causal_condition=False),
        # Text only (prompts of 4 and 7 tokens), a 2 x 6 target, every token on its own row's timestep.
        "layout": [7],
        "target": (2, 6),
        "valid": [4, 7],
        "timesteps": [0.75, 0.05],
        "lora": {"r": 3, "alpha": 6, "targets": "all-linear"},
    },
    {
        "name": "qwen_image21_two_images",
        "config": dict(num_layers=2, num_attention_heads=2, attention_head_dim=8, axes_dims_rope=(2, 2, 4),
                       context_in_dim=16, in_channels=8, out_channels=8, mlp_ratio=3, causal_condition=True),
        # Two condition images with text between them, a 6 x 4 target, no padding (no mask).
        "layout": [3, (2, 2), 2, (4, 2), 4],
        "target": (6, 4),
        "valid": None,
        "timesteps": [0.5, 0.9],
        "lora": {"r": 2, "alpha": 3, "targets": TARGETS},
    },
]


def transformer_case(spec, out_dir, g):
    from diffusers import QwenImage21Transformer2DModel

    name = spec["name"]
    model = QwenImage21Transformer2DModel(**spec["config"]).eval()
    randomize_(model, g)
    model.save_pretrained(f"{out_dir}/{name}", safe_serialization=True)
    c = model.config
    b = len(spec["timesteps"])
    slots, shapes = [], []
    for run in spec["layout"]:
        if isinstance(run, int):
            slots += [False] * run
        else:
            slots += [True] * (run[0] * run[1] // 4)
            shapes.append((1, *run))
    th, tw = spec["target"]
    shapes.append((1, th, tw))
    length = len(slots)
    img_mask = torch.tensor(slots + [True] * (th * tw // 4)).unsqueeze(0).expand(b, -1)
    tokens = sum(h * w for _, h, w in shapes)
    inp = {
        "hidden_states": torch.randn(b, tokens, c.in_channels, generator=g),
        "encoder_hidden_states": torch.randn(b, length, c.context_in_dim, generator=g),
        "timestep": torch.tensor(spec["timesteps"], dtype=torch.float32),
    }
    mask = None
    if spec["valid"] is not None:
        text_positions = [i for i, s in enumerate(slots) if not s]
        mask = torch.zeros(b, length, dtype=torch.bool)
        for row, valid in enumerate(spec["valid"]):
            mask[row] = torch.tensor(slots)  # image slots stay valid
            mask[row, text_positions[:valid]] = True
    call = dict(inp, img_shapes=[shapes] * b, img_mask=img_mask, encoder_hidden_states_mask=mask, return_dict=False)
    with torch.no_grad():
        out = model(**call)[0]
    io = {f"input.{k}": v for k, v in inp.items()}
    io["input.img_shapes"] = torch.tensor(shapes, dtype=torch.int64)
    io["input.img_mask"] = img_mask.to(torch.int64)
    if mask is not None:
        io["input.encoder_hidden_states_mask"] = mask.to(torch.int64)
    io["output.sample"] = out
    return lora_case(model, lambda: model(**call)[0], name, "qwen_image21_transformer", spec["lora"], io, out_dir, g)


VAE = dict(base_dim=8, decoder_base_dim=12, z_dim=16, num_res_blocks=1,
           latents_mean=[0.1 * (i % 7) - 0.3 for i in range(16)],
           latents_std=[1.0 + 0.25 * (i % 5) for i in range(16)])


def vae_case(out_dir, g):
    from diffusers import AutoencoderKLQwenImage21, QwenImage21Pipeline

    vae = AutoencoderKLQwenImage21(**VAE).eval()
    randomize_(vae, g, scale=0.1)
    vae.save_pretrained(f"{out_dir}/qwen_image21_vae", safe_serialization=True)
    pipe = types.SimpleNamespace(vae=vae, latent_channels=vae.config.z_dim)
    pixels = torch.randint(0, 256, (2, 64, 96, 4), generator=g, dtype=torch.uint8)
    io = {"input.pixels": pixels}
    with torch.no_grad():
        image = (pixels.permute(0, 3, 1, 2).float() / 127.5 - 1).unsqueeze(2)
        io["output.encoded_latents"] = QwenImage21Pipeline._encode_vae_image(pipe, image, None)[:, :, 0]
        latents = torch.randn(2, vae.config.z_dim, 4, 6, generator=g)
        io["input.decode_latents"] = latents
        mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
        io["output.decoded"] = vae.decode(latents.unsqueeze(2) * std + mean, return_dict=False)[0][:, :, 0]
    save_file({k: v.contiguous() for k, v in io.items()}, f"{out_dir}/qwen_image21_vae_io.safetensors")
    print("vae: encoded", tuple(io["output.encoded_latents"].shape), "decoded", tuple(io["output.decoded"].shape))


PROMPTS = ["a red circle next to a blue square",
           "一只猫坐在垫子上, \"OPEN\" 24/7, with a longer caption than the first prompt has"]
# Qwen3-VL's rendering of a system turn and a generation prompt (what the pipeline's __init__ tokenizes).
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
                 "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
                 "{% for c in message['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
                 "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SAMPLE_SIGMAS = [1.0, 0.8, 0.55, 0.3]


def tiny_pipeline(out_dir, g):
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImage21Pipeline, QwenImage21Transformer2DModel
    from diffusers import AutoencoderKLQwenImage21
    from transformers import AutoTokenizer, Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    tok = AutoTokenizer.from_pretrained(f"{out_dir}/qwen_image_pipeline/tokenizer")
    processor = Qwen3VLProcessor(image_processor=Qwen2VLImageProcessorPil(patch_size=16, merge_size=2),
                                 tokenizer=tok, video_processor=Qwen3VLVideoProcessor(), chat_template=CHAT_TEMPLATE)
    token = tok.convert_tokens_to_ids
    config = Qwen3VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=24, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=12, rope_theta=5e6,
                         max_position_embeddings=4096,
                         rope_scaling=dict(rope_type="default", mrope_section=[2, 2, 2], mrope_interleaved=True)),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=24,
                           patch_size=16, spatial_merge_size=2, temporal_patch_size=2, deepstack_visual_indexes=[0],
                           num_position_embeddings=16),
        image_token_id=token("<|image_pad|>"), video_token_id=token("<|video_pad|>"),
        vision_start_token_id=token("<|vision_start|>"), vision_end_token_id=token("<|vision_end|>"),
        tie_word_embeddings=False)
    text_encoder = Qwen3VLForConditionalGeneration(config).eval()
    randomize_(text_encoder, g, scale=0.1)
    transformer = QwenImage21Transformer2DModel(num_layers=2, num_attention_heads=2, attention_head_dim=16,
                                                axes_dims_rope=(4, 6, 6), context_in_dim=24, in_channels=16,
                                                out_channels=16).eval()
    randomize_(transformer, g, scale=0.1)
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="exponential", shift=1.0,
                                                base_image_seq_len=256, max_image_seq_len=4096, base_shift=0.5,
                                                max_shift=1.15)
    vae = AutoencoderKLQwenImage21.from_pretrained(f"{out_dir}/qwen_image21_vae")
    pipe = QwenImage21Pipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, processor=processor,
                               transformer=transformer, sample_sigmas=SAMPLE_SIGMAS)
    pipe.save_pretrained(f"{out_dir}/qwen_image21_pipeline")
    return QwenImage21Pipeline.from_pretrained(f"{out_dir}/qwen_image21_pipeline")


def pipeline_case(out_dir, g):
    pipe = tiny_pipeline(out_dir, g)
    io = {}
    with torch.no_grad():
        for key, prompts in [("prompt", PROMPTS), ("negative_prompt", [""] * len(PROMPTS))]:
            embeds, mask, slots = pipe.encode_prompt(prompts, device="cpu")
            assert not slots.any()
            io[f"output.{key}_embeds"] = embeds
            if mask is not None:
                io[f"output.{key}_mask"] = mask.to(torch.int64)
    b, h, w = len(PROMPTS), 64, 96
    x = torch.randn(b, pipe.transformer.config.in_channels, h // 16, w // 16, generator=g)
    io["input.initial_latents"] = x
    final = {}

    def keep(pipe_, i, t, kwargs):
        final["latents"] = kwargs["latents"]
        return {}

    images = pipe(prompt=list(PROMPTS), negative_prompt=[""] * b, true_cfg_scale=4.0, height=h, width=w,
                  latents=x.flatten(2).transpose(1, 2).clone(), output_type="np", callback_on_step_end=keep).images
    io["output.final_latents"] = final["latents"].transpose(1, 2).reshape(x.shape)
    io["output.images"] = torch.from_numpy(np.ascontiguousarray(images))
    io["output.sigmas"] = pipe.scheduler.sigmas.clone()
    save_file({k: v.contiguous() for k, v in io.items()}, f"{out_dir}/qwen_image21_pipeline_io.safetensors")
    print("pipeline: sigmas", [round(float(v), 4) for v in io["output.sigmas"]], "images", images.shape,
          "prompt mask", "output.prompt_mask" in io)


def main(out_dir):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(20261127)
    entries = [transformer_case(spec, out_dir, g) for spec in CONFIGS]
    update_manifest(out_dir, entries, "qwen_image21_transformer")
    for e in entries:
        print(e["name"], "lora params", e["lora_params"], "adapted", len(e["adapted_modules"]),
              "abs mean", e["output_abs_mean"])
    vae_case(out_dir, torch.Generator().manual_seed(20261128))
    pipeline_case(out_dir, torch.Generator().manual_seed(20261129))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fixtures")
