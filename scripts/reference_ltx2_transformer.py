"""Reference fixtures for flowtune's LTX-2 transformer port (diffusers' LTX2VideoTransformer3DModel).

Usage (the project venv: torch 2.11, diffusers 0.42, peft):
    python scripts/reference_ltx2_transformer.py fixtures
        writes the fixtures below and their manifest entries (kind `ltx2_transformer`).
    python scripts/reference_ltx2_transformer.py --check-lora NAME LORA_FILE [fixtures]
        loads LORA_FILE (a LoRA flowtune saved for fixture NAME) with LTX2Pipeline's
        `load_lora_weights` and compares the forward with the fixture's `output.sample_with_lora`.
    python scripts/reference_ltx2_transformer.py --check-tiny DIR
        loads a transformer folder written by flowtune's `write_random_transformer` with no missing or
        unexpected weights and runs it.
    (`LTX2_TRANSFORMER_KEEP=DIR cargo test --release -p flowtune-models --test ltx2_transformer` leaves
    `DIR/lora.safetensors`, from fixture ltx2_transformer_v23_tiny, and `DIR/tiny`.)

For each tiny random config (an LTX-2.0 layout: caption projections, interleaved rotary; an LTX-2.3
layout: gated attention, text modulation, split rotary, no caption projections), `<name>/` (config.json +
weights), `<name>_lora.safetensors` (a random PEFT LoRA on every attention projection and feed-forward
linear, video and audio) and `<name>_io.safetensors`, as LTX2Pipeline calls the transformer (B = 2, one
timestep per row passed as `timestep` and `sigma`, `use_cross_timestep=True`, positions from
`rope.prepare_video_coords` at the entry's `fps` and `audio_rope.prepare_audio_coords`):
`input.video_latents` (B, C, F, H, W) and `input.audio_latents` (B, C_a, L, M), their packed tokens
`input.hidden_states` and `input.audio_hidden_states` (the pipeline's `_pack_latents` and
`_pack_audio_latents`), `input.encoder_hidden_states` and `input.audio_encoder_hidden_states` (the
connectors' outputs), `input.encoder_attention_mask` (B, L) left-padded as Gemma pads, `input.timestep`
(B,); `output.video` and `output.audio` (the two velocities), `output.sample` = both concatenated along
the tokens (flowtune's joint latent layout), `output.sample_with_lora`, `loss_weight` and
`grad.transformer.*` of mean(sample_with_lora · loss_weight).

`ltx2_transformer_real_shapes.json`: the parameter names and shapes of the released LTX-2.0 sizes (and of
them with LTX-2.3's flags) with one block, from the meta device.
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file

from transformer_fixtures import lora_case, randomize_, update_manifest

KIND = "ltx2_transformer"

LTX2_TARGETS = [f"{attn}.{proj}" for attn in ["attn1", "attn2", "audio_attn1", "audio_attn2", "audio_to_video_attn",
                                              "video_to_audio_attn"]
                for proj in ["to_q", "to_k", "to_v", "to_out.0"]] + \
               ["ff.net.0.proj", "ff.net.2", "audio_ff.net.0.proj", "audio_ff.net.2"]

CASES = [
    {
        # LTX-2.0: caption projections, interleaved rotary (video width 10: 4 unturned channels).
        "name": "ltx2_transformer_v20_tiny",
        "config": dict(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=5,
                       cross_attention_dim=10, audio_in_channels=8, audio_out_channels=8,
                       audio_num_attention_heads=2, audio_attention_head_dim=4, audio_cross_attention_dim=8,
                       num_layers=2, caption_channels=12, rope_type="interleaved"),
        "latent": (3, 2, 3),
        "audio": (2, 7, 4),
        "text_len": 6,
        "valid": [6, 3],
        "t": [999.0, 412.5],
        "fps": 24.0,
        "lora": {"r": 4, "alpha": 8, "targets": LTX2_TARGETS},
    },
    {
        # LTX-2.3: gated attention, text modulation, no caption projections, split rotary grouped by 2
        # video and 4 audio heads (video width 8: 1 unturned pair); also single-precision frequencies,
        # affine block norms, no video feed-forward biases and the perturbed-attention processor (the
        # same forward without STG).
        "name": "ltx2_transformer_v23_tiny",
        "config": dict(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=4,
                       cross_attention_dim=8, audio_in_channels=8, audio_out_channels=8,
                       audio_num_attention_heads=4, audio_attention_head_dim=2, audio_cross_attention_dim=8,
                       num_layers=2, caption_channels=12, rope_type="split", gated_attn=True,
                       audio_gated_attn=True, cross_attn_mod=True, audio_cross_attn_mod=True,
                       use_prompt_embeddings=False, rope_double_precision=False, norm_elementwise_affine=True,
                       ff_bias=False, perturbed_attn=True),
        "latent": (2, 3, 2),
        "audio": (2, 5, 4),
        "text_len": 5,
        "valid": [4, 5],
        "t": [875.0, 60.0],
        "fps": 23.976,
        "lora": {"r": 3, "alpha": 6, "targets": LTX2_TARGETS},
    },
]


def make_inputs(model, spec, g):
    from diffusers import LTX2Pipeline

    c = model.config
    b = len(spec["t"])
    f, h, w = spec["latent"]
    ca, length, mel = spec["audio"]
    video = torch.randn(b, c.in_channels, f, h, w, generator=g)
    audio = torch.randn(b, ca, length, mel, generator=g)
    text_dim = c.caption_channels if c.use_prompt_embeddings else c.cross_attention_dim
    audio_text_dim = c.caption_channels if c.use_prompt_embeddings else c.audio_cross_attention_dim
    text = torch.randn(b, spec["text_len"], text_dim, generator=g)
    audio_text = torch.randn(b, spec["text_len"], audio_text_dim, generator=g)
    mask = torch.zeros(b, spec["text_len"], dtype=torch.int64)
    for row, n in enumerate(spec["valid"]):
        mask[row, spec["text_len"] - n:] = 1
    return {
        "video_latents": video,
        "audio_latents": audio,
        "hidden_states": LTX2Pipeline._pack_latents(video, c.patch_size, c.patch_size_t),
        "audio_hidden_states": LTX2Pipeline._pack_audio_latents(audio),
        "encoder_hidden_states": text,
        "audio_encoder_hidden_states": audio_text,
        "encoder_attention_mask": mask,
        "timestep": torch.tensor(spec["t"], dtype=torch.float32),
    }


def forward(model, inp, spec):
    """The pipeline's call: coords prepared once, `sigma=timestep`, `use_cross_timestep=True`."""
    b = inp["hidden_states"].shape[0]
    f, h, w = spec["latent"]
    length = inp["audio_hidden_states"].shape[1]
    video_coords = model.rope.prepare_video_coords(b, f, h, w, torch.device("cpu"), fps=spec["fps"])
    audio_coords = model.audio_rope.prepare_audio_coords(b, length, torch.device("cpu"))
    t = inp["timestep"]
    video, audio = model(
        hidden_states=inp["hidden_states"], audio_hidden_states=inp["audio_hidden_states"],
        encoder_hidden_states=inp["encoder_hidden_states"],
        audio_encoder_hidden_states=inp["audio_encoder_hidden_states"], timestep=t, sigma=t,
        encoder_attention_mask=inp["encoder_attention_mask"],
        audio_encoder_attention_mask=inp["encoder_attention_mask"], num_frames=f, height=h, width=w,
        fps=spec["fps"], audio_num_frames=length, video_coords=video_coords, audio_coords=audio_coords,
        isolate_modalities=False, spatio_temporal_guidance_blocks=None, perturbation_mask=None,
        use_cross_timestep=True, return_dict=False)
    return video, audio


def case(spec, out_dir, g):
    from diffusers import LTX2VideoTransformer3DModel

    name = spec["name"]
    model = LTX2VideoTransformer3DModel(**spec["config"]).eval()
    randomize_(model, g)
    model.save_pretrained(os.path.join(out_dir, name), safe_serialization=True)
    inp = make_inputs(model, spec, g)

    def run():
        return torch.cat(forward(model, inp, spec), dim=1)

    with torch.no_grad():
        video, audio = forward(model, inp, spec)
    io = {f"input.{k}": v for k, v in inp.items()}
    io.update({"output.video": video, "output.audio": audio, "output.sample": torch.cat([video, audio], 1)})
    entry = lora_case(model, run, name, KIND, spec["lora"], io, out_dir, g)
    entry.update({"latent": list(spec["latent"]), "audio": list(spec["audio"]), "fps": spec["fps"]})
    return entry


# The released sizes with one block: LTX-2.0 (diffusers' defaults) and its LTX-2.3-style flags.
REAL_LAYOUTS = {
    "ltx2_0_1_block": dict(num_layers=1),
    "ltx2_3_flags_1_block": dict(num_layers=1, gated_attn=True, audio_gated_attn=True, cross_attn_mod=True,
                                 audio_cross_attn_mod=True, use_prompt_embeddings=False, rope_type="split"),
}


def shapes_part(out_dir):
    """`ltx2_transformer_real_shapes.json`: every parameter name and shape of the released layouts, built on
    the meta device (no weights)."""
    import json

    from diffusers import LTX2VideoTransformer3DModel

    out = {}
    for name, config in REAL_LAYOUTS.items():
        with torch.device("meta"):
            model = LTX2VideoTransformer3DModel(**config)
        out[name] = {"config": {k: v for k, v in model.config.items() if not k.startswith("_")},
                     "shapes": {k: list(p.shape) for k, p in model.state_dict().items()}}
    with open(os.path.join(out_dir, "ltx2_transformer_real_shapes.json"), "w") as f:
        json.dump(out, f, indent=0)
        f.write("\n")
    print("ltx2_transformer_real_shapes.json:", {k: len(v["shapes"]) for k, v in out.items()})


def check_lora(name, lora_file, out_dir):
    """diffusers loads a LoRA flowtune saved (PEFT names under `transformer.`, scales from its
    `lora_adapter_metadata`) through LTX2Pipeline's loader and reproduces the fixture's forward with it."""
    from diffusers import LTX2VideoTransformer3DModel
    from diffusers.loaders.lora_pipeline import LTX2LoraLoaderMixin

    class Holder(LTX2LoraLoaderMixin):
        """The pipeline's LoRA loader over the transformer alone."""

        hf_device_map = None

        @property
        def components(self):
            return {"transformer": self.transformer}

    spec = next(s for s in CASES if s["name"] == name)
    holder = Holder()
    holder.transformer = LTX2VideoTransformer3DModel.from_pretrained(os.path.join(out_dir, name)).eval()
    holder.load_lora_weights(lora_file, adapter_name="flowtune")
    io = load_file(os.path.join(out_dir, f"{name}_io.safetensors"))
    inp = {k[len("input."):]: v for k, v in io.items() if k.startswith("input.")}
    with torch.no_grad():
        out = torch.cat(forward(holder.transformer, inp, spec), dim=1)
    want = io["output.sample_with_lora"]
    rel = ((out - want).norm() / want.norm()).item()
    print(f"{name}: LTX2Pipeline.load_lora_weights({lora_file}): relative error {rel:.2e} vs "
          "output.sample_with_lora")
    assert rel < 1e-5, rel


def check_tiny(path):
    from diffusers import LTX2VideoTransformer3DModel

    model, info = LTX2VideoTransformer3DModel.from_pretrained(path, output_loading_info=True)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    assert not bad, bad
    c = model.config
    spec = {"latent": (2, 2, 3), "fps": 24.0}
    g = torch.Generator().manual_seed(0)
    inp = {
        "hidden_states": torch.randn(1, 12, c.in_channels, generator=g),
        "audio_hidden_states": torch.randn(1, 5, c.audio_in_channels, generator=g),
        "encoder_hidden_states": torch.randn(1, 4, c.caption_channels, generator=g),
        "audio_encoder_hidden_states": torch.randn(1, 4, c.caption_channels, generator=g),
        "encoder_attention_mask": torch.ones(1, 4, dtype=torch.int64),
        "timestep": torch.tensor([500.0]),
    }
    with torch.no_grad():
        video, audio = forward(model.eval(), inp, spec)
    assert torch.isfinite(video).all() and torch.isfinite(audio).all()
    print(f"{path}: loads with every weight; video {tuple(video.shape)}, audio {tuple(audio.shape)}")


def main(argv):
    if argv and argv[0] == "--check-lora":
        check_lora(argv[1], argv[2], argv[3] if len(argv) > 3 else "fixtures")
        return
    if argv and argv[0] == "--check-tiny":
        check_tiny(argv[1])
        return
    out_dir = argv[0] if argv else "fixtures"
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(20261129)
    entries = [case(spec, out_dir, g) for spec in CASES]
    update_manifest(out_dir, entries, KIND)
    shapes_part(out_dir)
    for e in entries:
        print(e["name"], "lora params", e["lora_params"], "adapted", len(e["adapted_modules"]),
              "output |mean|", e["output_abs_mean"])


if __name__ == "__main__":
    main(sys.argv[1:])
