"""Shared by the transformer reference scripts: random weights, the LoRA pass with its gradients, the
manifest entries."""
import json
import os

import torch
from safetensors.torch import save_file


def randomize_(module, g, scale=0.2):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)


def lora_case(model, forward, name, kind, lcfg, io, out_dir, g):
    """Adds a random LoRA (`lcfg`: r, alpha, targets) to `model` and writes `<name>_lora.safetensors` and
    `<name>_io.safetensors`: `io` (inputs, `output.sample`) plus `output.sample_with_lora`, `loss_weight` and
    `grad.transformer.*` of mean(sample_with_lora * loss_weight), `forward()` running the model. Returns the
    manifest entry."""
    from peft import LoraConfig, get_peft_model_state_dict

    out = io["output.sample"]
    model.add_adapter(LoraConfig(r=lcfg["r"], lora_alpha=lcfg["alpha"], target_modules=lcfg["targets"],
                                 init_lora_weights="gaussian"))
    with torch.no_grad():
        for n_, p in model.named_parameters():
            if "lora_A" in n_ or "lora_B" in n_:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    lora_sd = {f"transformer.{k}": v.contiguous() for k, v in get_peft_model_state_dict(model).items()}
    save_file(lora_sd, os.path.join(out_dir, f"{name}_lora.safetensors"))
    for p_name, p in model.named_parameters():
        p.requires_grad_("lora_" in p_name)
    weight = torch.randn(out.shape, generator=g)
    out_lora = forward()
    (out_lora * weight).mean().backward()
    io["output.sample_with_lora"] = out_lora.detach()
    io["loss_weight"] = weight
    grads = {
        f"grad.transformer.{p_name.replace('.default', '')}": p.grad.detach().clone()
        for p_name, p in model.named_parameters()
        if p.grad is not None
    }
    io.update(grads)
    save_file({k: v.contiguous() for k, v in io.items()}, os.path.join(out_dir, f"{name}_io.safetensors"))
    targets = lcfg["targets"] if isinstance(lcfg["targets"], list) else [lcfg["targets"]]
    return {
        "name": name,
        "kind": kind,
        "model": name,
        "class": type(model).__name__,
        "lora": {"r": lcfg["r"], "alpha": lcfg["alpha"], "targets": targets},
        "loss": "mean(sample_with_lora * loss_weight)",
        "lora_params": len(grads),
        "adapted_modules": sorted({k[len("transformer."):].rsplit(".lora_", 1)[0] for k in lora_sd}),
        "output_abs_mean": out.abs().mean().item(),
    }


def update_manifest(out_dir, entries, kind):
    path = os.path.join(out_dir, "manifest.json")
    manifest = json.load(open(path))
    manifest["models"] = [m for m in manifest["models"] if m.get("kind") != kind] + entries
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
