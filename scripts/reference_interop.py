"""Interop fixtures: checkpoints and adapters as diffusers 0.42, transformers 5 and PEFT save them (issue 33).

Usage (the project's reference venv: torch, diffusers, transformers, peft):
    python scripts/reference_interop.py cfg fixtures
    python scripts/reference_interop.py clip fixtures
    python scripts/reference_interop.py lora fixtures

cfg: `ZImagePipeline.__call__` on `fixtures/z_image_pipeline` (4 Euler steps, given initial latents, output_type
    "latent") at guidance 0, 0.5, 1 and 3 -> `z_image_cfg_io.safetensors` (`input.initial_latents`,
    `output.final_latents.g<scale with p for .>`). diffusers runs CFG whenever guidance_scale > 0.
clip: a tiny random `CLIPTextModel` (FLUX.1's `text_encoder`) saved by transformers 5, whose keys lack the
    `text_model.` prefix -> `clip_text_v5/` and `clip_text_v5_io.safetensors` (`input.input_ids` ->
    `output.last_hidden_state`, `output.pooler_output`, `output.penultimate_hidden_state`).
lora: LoRAs on `fixtures/sd3_tiny` saved by `StableDiffusion3Pipeline.save_lora_weights` with PEFT's config as
    metadata (`use_rslora`; `alpha_pattern`; `rank_pattern` with `alpha_pattern`) and one without metadata (mixed ranks,
    which diffusers reads as alpha = rank per module) -> `sd3_lora_<case>.safetensors`, and
    `sd3_lora_options_io.safetensors` with `output.<case>` = the transformer on `sd3_tiny_io`'s inputs after
    diffusers' `load_lora_into_transformer` (the path `load_lora_weights` takes).
lora-check DIR: every `<case>.safetensors` in DIR (LoRAs flowtune exported) loaded by diffusers onto `sd3_tiny`,
    compared with `<case>.out.safetensors` (`output`, flowtune's transformer output on `sd3_tiny_io`'s inputs).
layouts FLOWTUNE: saves a tiny random model of every transformers class a pipeline's text encoder can be with this
    transformers (5.x), runs `FLOWTUNE debug forward` on each and prints the largest relative difference; writes nothing.
"""
import os
import shutil
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

CFG_PROMPTS = ["a red circle next to a blue square", "a cat on a mat"]
CFG_SCALES = [0.0, 0.5, 1.0, 3.0]


def scale_key(g):
    return "g" + f"{g}".replace(".", "p")


def cfg(out_dir):
    from diffusers import ZImagePipeline

    pipe = ZImagePipeline.from_pretrained(os.path.join(out_dir, "z_image_pipeline"))
    h, w = 16, 24
    f = pipe.vae_scale_factor
    g = torch.Generator().manual_seed(11)
    x = torch.randn(len(CFG_PROMPTS), pipe.transformer.in_channels, h // f, w // f, generator=g)
    io = {"input.initial_latents": x.clone()}
    for scale in CFG_SCALES:
        with torch.no_grad():
            # A copy: the pipeline writes the chat template into the list it is given.
            out = pipe(list(CFG_PROMPTS), height=h, width=w, num_inference_steps=4, guidance_scale=scale,
                       latents=x.clone(), output_type="latent", return_dict=False)[0]
        io[f"output.final_latents.{scale_key(scale)}"] = out
    path = os.path.join(out_dir, "z_image_cfg_io.safetensors")
    save_file({k: v.contiguous() for k, v in io.items()}, path)
    print(f"wrote {path}")


def clip(out_dir):
    import transformers
    from safetensors import safe_open
    from transformers import CLIPTextConfig, CLIPTextModel

    assert transformers.__version__.startswith("5."), transformers.__version__
    torch.manual_seed(3)
    config = CLIPTextConfig(vocab_size=1000, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                            num_attention_heads=2, max_position_embeddings=16, projection_dim=16,
                            hidden_act="quick_gelu", bos_token_id=998, eos_token_id=999, pad_token_id=1)
    model = CLIPTextModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    path = os.path.join(out_dir, "clip_text_v5")
    model.save_pretrained(path)
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        assert not any(k.startswith("text_model.") for k in f.keys()), "expected transformers 5's layout"
    ids = torch.tensor([[998, 5, 77, 300, 999, 1, 1, 1], [998, 12, 640, 41, 8, 903, 27, 999]])
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    io = {"input.input_ids": ids, "output.last_hidden_state": out.last_hidden_state,
          "output.pooler_output": out.pooler_output, "output.penultimate_hidden_state": out.hidden_states[-2]}
    save_file({k: v.contiguous() for k, v in io.items()}, os.path.join(out_dir, "clip_text_v5_io.safetensors"))
    print(f"wrote {path}")


SD3_TARGETS = ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj",
               "attn.add_v_proj", "attn.to_add_out"]
LORA_CASES = {
    "rslora": dict(r=4, lora_alpha=8, use_rslora=True),
    "alpha_pattern": dict(r=4, lora_alpha=8, alpha_pattern={"to_q": 2, "transformer_blocks.0.attn.to_k": 16}),
    "rank_pattern": dict(r=4, lora_alpha=8, rank_pattern={"to_v": 2, "transformer_blocks.1.attn.to_q": 6},
                         alpha_pattern={"add_k_proj": 3}),
    "no_metadata": dict(r=4, lora_alpha=4, rank_pattern={"to_out.0": 2}, alpha_pattern={"to_out.0": 2}),
}


def sd3_with_lora(out_dir, state_dict, metadata):
    """sd3_tiny with `state_dict` loaded as `StableDiffusion3Pipeline.load_lora_weights` loads it, and its output."""
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline

    io = load_file(os.path.join(out_dir, "sd3_tiny_io.safetensors"))
    transformer = SD3Transformer2DModel.from_pretrained(os.path.join(out_dir, "sd3_tiny")).eval()
    StableDiffusion3Pipeline.load_lora_into_transformer(state_dict, transformer=transformer, metadata=metadata)
    with torch.no_grad():
        return transformer(hidden_states=io["input.hidden_states"], encoder_hidden_states=io["input.encoder_hidden_states"],
                           pooled_projections=io["input.pooled_projections"], timestep=io["input.timestep"],
                           return_dict=False)[0]


def lora(out_dir):
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline
    from peft import LoraConfig, get_peft_model_state_dict

    io = {}
    for i, (case, options) in enumerate(LORA_CASES.items()):
        torch.manual_seed(100 + i)
        transformer = SD3Transformer2DModel.from_pretrained(os.path.join(out_dir, "sd3_tiny"))
        config = LoraConfig(target_modules=SD3_TARGETS, **options)
        transformer.add_adapter(config)
        with torch.no_grad():
            for name, p in transformer.named_parameters():
                if "lora_" in name:
                    p.normal_(0, 0.3)
        layers = get_peft_model_state_dict(transformer)
        path = os.path.join(out_dir, f"sd3_lora_{case}.safetensors")
        metadata = None if case == "no_metadata" else config.to_dict()
        with tempfile.TemporaryDirectory() as tmp:
            StableDiffusion3Pipeline.save_lora_weights(tmp, transformer_lora_layers=layers,
                                                       transformer_lora_adapter_metadata=metadata)
            shutil.copy(os.path.join(tmp, "pytorch_lora_weights.safetensors"), path)
        state_dict, read = StableDiffusion3Pipeline.lora_state_dict(path, return_lora_metadata=True)
        io[f"output.{case}"] = sd3_with_lora(out_dir, state_dict, read)
        print(f"wrote {path}")
    save_file({k: v.contiguous() for k, v in io.items()}, os.path.join(out_dir, "sd3_lora_options_io.safetensors"))


def lora_check(exported):
    from diffusers import StableDiffusion3Pipeline

    fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
    worst = 0.0
    for name in sorted(f for f in os.listdir(exported) if f.endswith(".safetensors") and ".out." not in f):
        path = os.path.join(exported, name)
        state_dict, metadata = StableDiffusion3Pipeline.lora_state_dict(path, return_lora_metadata=True)
        got = sd3_with_lora(fixtures, state_dict, metadata)
        want = load_file(path.replace(".safetensors", ".out.safetensors"))["output"]
        rel = ((got - want).norm() / want.norm()).item()
        worst = max(worst, rel)
        print(f"{name} ({ {k: v for k, v in metadata.items() if 'pattern' in k or 'rslora' in k} }): diffusers vs "
              f"flowtune relative difference {rel:.2e}")
    sys.exit(0 if worst < 1e-5 else 1)


def layouts(flowtune):
    import subprocess

    import transformers as tf

    clip_cfg = dict(vocab_size=99, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                    max_position_embeddings=16, projection_dim=8, bos_token_id=97, eos_token_id=98)
    t5_cfg = dict(vocab_size=99, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
                  feed_forward_proj="gated-gelu")
    qwen3_cfg = dict(vocab_size=99, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=8)
    cases = [  # (class, config, flowtune's output, transformers' output of (model, ids))
        (tf.CLIPTextModel, tf.CLIPTextConfig(**clip_cfg), "last_hidden_state", lambda m, i: m(i).last_hidden_state),
        (tf.CLIPTextModelWithProjection, tf.CLIPTextConfig(**clip_cfg), "text_embeds", lambda m, i: m(i).text_embeds),
        (tf.T5EncoderModel, tf.T5Config(**t5_cfg), "last_hidden_state", lambda m, i: m(i).last_hidden_state),
        (tf.UMT5EncoderModel, tf.UMT5Config(**t5_cfg), "last_hidden_state", lambda m, i: m(i).last_hidden_state),
        (tf.Qwen3Model, tf.Qwen3Config(**qwen3_cfg), "hidden_states_m2",
         lambda m, i: m(i, output_hidden_states=True).hidden_states[-2]),
        (tf.Qwen3ForCausalLM, tf.Qwen3Config(**qwen3_cfg), "hidden_states_m2",
         lambda m, i: m(i, output_hidden_states=True).hidden_states[-2]),
    ]
    ids = torch.tensor([[97, 5, 17, 40, 98, 98], [97, 12, 64, 41, 8, 98]])
    worst = 0.0
    for cls, config, key, reference in cases:
        torch.manual_seed(0)
        model = cls(config).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.2)
            want = reference(model, ids)
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(f"{tmp}/model")
            save_file({"input.input_ids": ids}, f"{tmp}/in.safetensors")
            subprocess.run([flowtune, "debug", "forward", "--component", f"{tmp}/model", "--inputs",
                            f"{tmp}/in.safetensors", "--out", f"{tmp}/out.safetensors"], check=True,
                           stdout=subprocess.DEVNULL)
            got = load_file(f"{tmp}/out.safetensors")[f"output.{key}"]
        rel = ((got - want).norm() / want.norm()).item()
        worst = max(worst, rel)
        print(f"{cls.__name__} saved by transformers {tf.__version__}: {key} relative difference {rel:.2e}")
    sys.exit(0 if worst < 1e-5 else 1)


if __name__ == "__main__":
    {"cfg": cfg, "clip": clip, "lora": lora, "lora-check": lora_check, "layouts": layouts}[sys.argv[1]](sys.argv[2])
