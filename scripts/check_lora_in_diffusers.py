"""Check that a LoRA written by flowtune gives the same transformer output in diffusers.

Usage (needs `pip install torch diffusers transformers peft`), for SD3, Qwen-Image, Qwen-Image 2.1, Z-Image, FLUX.1, FLUX.2 or
Wan:
    flowtune make-tiny sd3 /tmp/tiny            # or: make-tiny qwen-image | qwen-image21 | z-image | flux [--schnell] | flux2 | wan [--wan21]
    flowtune debug make-lora --component /tmp/tiny/transformer --out /tmp/lora.safetensors
    # Z-Image's layers: --target-modules to_q,to_k,to_v,to_out.0,feed_forward.w1,feed_forward.w2,feed_forward.w3
    # FLUX.1's targets: --target-modules attn.to_q,attn.to_k,attn.to_v,attn.to_out.0,attn.add_q_proj,\
    #   attn.add_k_proj,attn.add_v_proj,attn.to_add_out,proj_mlp,proj_out
    # FLUX.2's targets: --target-modules attn.to_q,attn.to_k,attn.to_v,attn.to_out.0,attn.add_q_proj,\
    #   attn.add_k_proj,attn.add_v_proj,attn.to_add_out,attn.to_qkv_mlp_proj,ff.linear_in,ff.linear_out,\
    #   ff_context.linear_in,ff_context.linear_out
    # Qwen-Image 2.1's targets: --target-modules attn.to_q,attn.to_k,attn.to_v,attn.to_out.0,img_mlp.proj,\
    #   img_mlp.gate_layer,img_mlp.out
    # Wan's targets: --target-modules attn1.to_q,attn1.to_k,attn1.to_v,attn1.to_out.0,attn2.to_q,attn2.to_k,\
    #   attn2.to_v,attn2.to_out.0,ffn.net.0.proj,ffn.net.2
    python scripts/check_lora_in_diffusers.py /tmp/tiny /tmp/lora.safetensors target/release/flowtune

Loads the pipeline in diffusers, applies the LoRA with `pipe.load_lora_weights`, runs the
transformer on random inputs, runs `flowtune debug forward --lora` on the same inputs, and prints
the relative difference (and the LoRA's effect, to show it was applied). Exit code 1 above 1e-3.

A two-expert Wan pipeline (`make-tiny wan --a14b`, Wan2.2-T2V-A14B) with a LoRA trained by flowtune: the low-noise
expert's file beside it (`<stem>_transformer_2.safetensors`) is loaded too, with `weight_name=...` and
`load_into_transformer_2=True`, and `transformer_2` checked the same way:
    python scripts/check_lora_in_diffusers.py /tmp/tiny runs/x/lora/pytorch_lora_weights.safetensors target/release/flowtune
"""
import os
import subprocess
import sys
import tempfile

import torch
from diffusers import DiffusionPipeline
from safetensors.torch import load_file, save_file


def example_inputs(cls, c, g):
    """The transformer's forward arguments, named as `flowtune debug forward` reads them."""
    if cls == "QwenImageTransformer2DModel":
        # 3 × 4 packed tokens; the second prompt has 5 of its 9 tokens.
        mask = torch.ones(2, 9, dtype=torch.int64)
        mask[1, 5:] = 0
        return {
            "input.hidden_states": torch.randn(2, 12, c.in_channels, generator=g),
            "input.encoder_hidden_states": torch.randn(2, 9, c.joint_attention_dim, generator=g),
            "input.encoder_hidden_states_mask": mask,
            "input.timestep": torch.tensor([0.999, 0.3125]),
            "input.img_shapes": torch.tensor([[1, 3, 4]]),
        }
    if cls == "QwenImage21Transformer2DModel":
        # 3 × 4 target tokens (3 slots after the 9 text positions); the second prompt has 5 of its 9 tokens.
        mask = torch.ones(2, 9, dtype=torch.int64)
        mask[1, 5:] = 0
        slots = torch.cat([torch.zeros(2, 9, dtype=torch.int64), torch.ones(2, 3, dtype=torch.int64)], 1)
        return {
            "input.hidden_states": torch.randn(2, 12, c.in_channels, generator=g),
            "input.encoder_hidden_states": torch.randn(2, 9, c.context_in_dim, generator=g),
            "input.encoder_hidden_states_mask": mask,
            "input.timestep": torch.tensor([0.999, 0.3125]),
            "input.img_shapes": torch.tensor([[1, 3, 4]]),
            "input.img_mask": slots,
        }
    if cls == "ZImageTransformer2DModel":
        # One frame of 6 × 8 latents per row; the second caption has 5 of its 9 tokens.
        mask = torch.ones(2, 9, dtype=torch.int64)
        mask[1, 5:] = 0
        return {
            "input.x": torch.randn(2, c.in_channels, 1, 6, 8, generator=g),
            "input.t": torch.tensor([0.001, 0.6875]),
            "input.cap_feats": torch.randn(2, 9, c.cap_feat_dim, generator=g),
            "input.cap_mask": mask,
        }
    if cls == "FluxTransformer2DModel":
        # 3 × 4 packed tokens with their [0, row, column] ids; zero text ids; [dev]'s guidance.
        ids = torch.zeros(3, 4, 3)
        ids[..., 1] += torch.arange(3)[:, None]
        ids[..., 2] += torch.arange(4)[None, :]
        inputs = {
            "input.hidden_states": torch.randn(2, 12, c.in_channels, generator=g),
            "input.encoder_hidden_states": torch.randn(2, 9, c.joint_attention_dim, generator=g),
            "input.pooled_projections": torch.randn(2, c.pooled_projection_dim, generator=g),
            "input.timestep": torch.tensor([0.999, 0.3125]),
            "input.img_ids": ids.reshape(12, 3),
            "input.txt_ids": torch.zeros(9, 3),
        }
        if c.guidance_embeds:
            inputs["input.guidance"] = torch.tensor([3.5, 2.0])
        return inputs
    if cls == "Flux2Transformer2DModel":
        # 3 × 4 latent tokens with their (0, row, column, 0) ids; text ids (0, 0, 0, index); [dev]'s guidance.
        inputs = {
            "input.hidden_states": torch.randn(2, 12, c.in_channels, generator=g),
            "input.encoder_hidden_states": torch.randn(2, 9, c.joint_attention_dim, generator=g),
            "input.timestep": torch.tensor([0.999, 0.3125]),
            "input.img_ids": torch.cartesian_prod(torch.arange(1), torch.arange(3), torch.arange(4),
                                                  torch.arange(1)).float(),
            "input.txt_ids": torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1),
                                                  torch.arange(9)).float(),
        }
        if c.guidance_embeds:
            inputs["input.guidance"] = torch.tensor([4.0, 2.0])
        return inputs
    if cls == "WanTransformer3DModel":
        # 2 latent frames of 4 × 6 cells; the second prompt zero-padded after 5 of its 9 tokens.
        text = torch.randn(2, 9, c.text_dim, generator=g)
        text[1, 5:] = 0
        return {
            "input.hidden_states": torch.randn(2, c.in_channels, 2, 4, 6, generator=g),
            "input.timestep": torch.tensor([999.0, 312.5]),
            "input.encoder_hidden_states": text,
        }
    return {
        "input.hidden_states": torch.randn(2, c.in_channels, 16, 12, generator=g),
        "input.encoder_hidden_states": torch.randn(2, 9, c.joint_attention_dim, generator=g),
        "input.pooled_projections": torch.randn(2, c.pooled_projection_dim, generator=g),
        "input.timestep": torch.tensor([999.0, 312.5]),
    }


def run(t, args):
    """The transformer's output on `args`; Z-Image takes lists (one frame, each row's caption tokens), Qwen-Image 2.1
    boolean masks."""
    if type(t).__name__ == "QwenImage21Transformer2DModel":
        args = dict(args, img_mask=args["img_mask"].bool(),
                    encoder_hidden_states_mask=args["encoder_hidden_states_mask"].bool())
    if type(t).__name__ != "ZImageTransformer2DModel":
        return t(**args, return_dict=False)[0]
    caps = [c[m.bool()] for c, m in zip(args["cap_feats"], args["cap_mask"])]
    return torch.stack(t(list(args["x"].unbind(0)), args["t"], caps, return_dict=False)[0])


def check(pipe, component, load, pipeline_dir, lora_file, flowtune):
    """Whether `component` with the LoRA applied by `load()` matches `flowtune debug forward --lora lora_file`."""
    t = getattr(pipe, component).eval()
    inputs = example_inputs(type(t).__name__, t.config, torch.Generator().manual_seed(0))
    args = {k.removeprefix("input."): v for k, v in inputs.items()}
    if "img_shapes" in args:
        args["img_shapes"] = [[tuple(s) for s in args["img_shapes"].tolist()]] * args["hidden_states"].shape[0]
    with torch.no_grad():
        base = run(t, args)
        load()
        ours_ref = run(t, args)
    with tempfile.TemporaryDirectory() as tmp:
        save_file(inputs, f"{tmp}/in.safetensors")
        subprocess.run(
            [flowtune, "debug", "forward", "--component", f"{pipeline_dir}/{component}", "--inputs", f"{tmp}/in.safetensors",
             "--out", f"{tmp}/out.safetensors", "--lora", lora_file],
            check=True,
        )
        flowtune_out = load_file(f"{tmp}/out.safetensors")["output.sample_with_lora"]
    diff = ((flowtune_out - ours_ref).norm() / ours_ref.norm()).item()
    effect = ((ours_ref - base).norm() / base.norm()).item()
    print(f"{component}: relative difference flowtune vs diffusers with LoRA: {diff:.2e} "
          f"(LoRA changes the output by {effect:.2e})")
    return diff < 1e-3 and effect > 1e-3


def main(pipeline_dir, lora_file, flowtune):
    pipe = DiffusionPipeline.from_pretrained(pipeline_dir)
    ok = check(pipe, "transformer", lambda: pipe.load_lora_weights(lora_file), pipeline_dir, lora_file, flowtune)
    if getattr(pipe, "transformer_2", None) is not None:
        stem, ext = os.path.splitext(lora_file)
        second = f"{stem}_transformer_2{ext}"
        load = lambda: pipe.load_lora_weights(  # noqa: E731
            os.path.dirname(second), weight_name=os.path.basename(second), load_into_transformer_2=True)
        ok = check(pipe, "transformer_2", load, pipeline_dir, second, flowtune) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
