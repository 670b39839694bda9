"""DiffusionOPD fixtures: a PyTorch reimplementation of the reference's `distill_kl` loss (verl-omni,
`docs/algo/diffusion_opd.md`: per step `‖μ_θ − μ_teacher‖² / (2σ_t²)` averaged over latent
elements, then over the batch), plus flowtune's per-row teacher weights (several teachers).

    PYTHONPATH=/tmp/pylib ~/.cache/flowtune/venv/bin/python scripts/reference_diffusion_opd.py

Needs torch and safetensors; no GPU, no network. Deterministic. Writes
`fixtures/diffusion_opd.json` and `fixtures/diffusion_opd.safetensors`: inputs `prev_sample_mean`,
`teacher_prev_sample_mean` [B, 4, 3, 3], `std_dev_t` [B] and `weights` [B]; per case (`weighted`)
the expected `value` and `case<i>.grad_prev_sample_mean`.
"""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent.parent / "fixtures"


def distill_kl(mean, teacher, std, weights=None):
    std = std.view(-1, 1, 1, 1)
    per_row = ((mean - teacher) ** 2).mean(dim=(1, 2, 3), keepdim=True) / (2 * std**2)
    per_row = per_row.flatten()
    if weights is not None:
        per_row = per_row * weights
    return per_row.mean()


def main():
    g = torch.Generator().manual_seed(37)
    shape = (5, 4, 3, 3)
    base = {
        "prev_sample_mean": torch.randn(shape, generator=g),
        "std_dev_t": torch.rand(5, generator=g) * 0.5 + 0.2,
        "weights": torch.tensor([1.0, 0.5, 2.0, 1.0, 0.5]),
    }
    base["teacher_prev_sample_mean"] = base["prev_sample_mean"] + 0.1 * torch.randn(shape, generator=g)
    tensors, cases = dict(base), []
    for i, weighted in enumerate([False, True]):
        mean = base["prev_sample_mean"].clone().requires_grad_(True)
        loss = distill_kl(
            mean, base["teacher_prev_sample_mean"], base["std_dev_t"], base["weights"] if weighted else None
        )
        loss.backward()
        tensors[f"case{i}.grad_prev_sample_mean"] = mean.grad
        cases.append({"weighted": weighted, "value": loss.item()})
    save_file({k: v.contiguous() for k, v in tensors.items()}, OUT / "diffusion_opd.safetensors")
    (OUT / "diffusion_opd.json").write_text(json.dumps({"cases": cases}, indent=1) + "\n")
    print(cases)


if __name__ == "__main__":
    main()
