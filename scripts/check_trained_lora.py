"""LoRAs flowtune trained, loaded by diffusers onto the same transformer, give flowtune's output (issue 33).

Usage (the reference venv: torch, diffusers, peft):
    flowtune make-tiny sd3 PIPE
    flowtune train examples/flow_grpo_tiny.yaml model.path=PIPE trainer.output_dir=WORK/rslora model.lora.use_rslora=true
    ... (WORK/<case> for each case, e.g. model.lora.alpha_pattern=..., model.lora.rank_pattern=...)
    python scripts/check_trained_lora.py FLOWTUNE PIPE WORK rslora ...

For each case: `flowtune debug forward` with WORK/<case>/lora/pytorch_lora_weights.safetensors on random inputs
against diffusers' SD3Transformer2DModel after `StableDiffusion3Pipeline.load_lora_into_transformer` (the path
`load_lora_weights` takes, reading the adapter's metadata); exits 1 if any differs by 1e-5 or more (relative).
"""
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file
from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline
flowtune, pipe, work = sys.argv[1], sys.argv[2], sys.argv[3]
t = SD3Transformer2DModel.from_pretrained(os.path.join(pipe, "transformer")).eval()
c = t.config
torch.manual_seed(0)
io = {"input.hidden_states": torch.randn(2, c.in_channels, 8, 8), "input.timestep": torch.tensor([700.0, 200.0]),
      "input.encoder_hidden_states": torch.randn(2, 12, c.joint_attention_dim),
      "input.pooled_projections": torch.randn(2, c.pooled_projection_dim)}
save_file(io, os.path.join(work, "io.safetensors"))
worst = 0.0
for case in sys.argv[4:]:
    lora = os.path.join(work, case, "lora", "pytorch_lora_weights.safetensors")
    out = os.path.join(work, case + ".out.safetensors")
    subprocess.run([flowtune, "debug", "forward", "--component", os.path.join(pipe, "transformer"), "--inputs",
                    os.path.join(work, "io.safetensors"), "--out", out, "--lora", lora], check=True, capture_output=True)
    got_ft = next(iter(load_file(out).values()))
    sd, meta = StableDiffusion3Pipeline.lora_state_dict(lora, return_lora_metadata=True)
    tr = SD3Transformer2DModel.from_pretrained(os.path.join(pipe, "transformer")).eval()
    StableDiffusion3Pipeline.load_lora_into_transformer(sd, transformer=tr, metadata=meta)
    with torch.no_grad():
        ref = tr(hidden_states=io["input.hidden_states"], encoder_hidden_states=io["input.encoder_hidden_states"],
                 pooled_projections=io["input.pooled_projections"], timestep=io["input.timestep"], return_dict=False)[0]
    base = t(hidden_states=io["input.hidden_states"], encoder_hidden_states=io["input.encoder_hidden_states"],
             pooled_projections=io["input.pooled_projections"], timestep=io["input.timestep"], return_dict=False)[0].detach()
    rel = ((got_ft - ref).norm() / ref.norm()).item()
    moved = ((ref - base).norm() / base.norm()).item()
    worst = max(worst, rel)
    print(f"{case}: metadata {{{', '.join(k for k in meta if 'pattern' in k or 'rslora' in k)}}} flowtune vs diffusers {rel:.2e} (the LoRA moves the output by {moved:.2e})")
sys.exit(0 if worst < 1e-5 else 1)
