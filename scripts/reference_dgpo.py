"""DGPO fixtures: a PyTorch reimplementation of the reference's loss (DGPO's
`scripts/train_sd3_dgpo.py`, `compute_group_dgpo_loss_allreduce` with its PPO-style clip, as
verl-omni's `DGPOLoss` documents it), written one group at a time.

    PYTHONPATH=/tmp/pylib ~/.cache/flowtune/venv/bin/python scripts/reference_dgpo.py

Needs torch and safetensors; no GPU, no network. Deterministic. Writes `fixtures/dgpo.json` and
`fixtures/dgpo.safetensors`: shared inputs `x0`, `noise`, `policy_pred`, `old_pred`, `ref_pred`
[B, 4, 3, 3], `advantages` [B], `groups` [B] (int64; groups of 3, 2 and 3 rows), and per case
(`beta`, `clip_range`, `ref_kl_coef`, `adv_clip_max`) the expected `value`, metrics
(`policy_loss`, `kl_loss`, `dsm_loss`, `clip_frac`, `group_weight_mean`, `group_weight_dev`) and
`case<i>.grad_policy_pred`.
"""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent.parent / "fixtures"


def dgpo(t, beta, clip_range, ref_kl_coef, adv_clip_max):
    target = t["noise"] - t["x0"]
    adv = t["advantages"].clamp(-adv_clip_max, adv_clip_max)
    dsm = ((target - t["policy_pred"]) ** 2).flatten(1).mean(1)
    ref_dsm = ((target - t["ref_pred"]) ** 2).flatten(1).mean(1)
    old_dsm = ((target - t["old_pred"]) ** 2).flatten(1).mean(1)
    groups = t["groups"].tolist()
    weights = torch.empty_like(dsm)
    for g in set(groups):
        members = [i for i, x in enumerate(groups) if x == g]
        score = sum(adv[i] * beta * (dsm[i].detach() - ref_dsm[i]) / len(members) for i in members)
        for i in members:
            weights[i] = torch.sigmoid(score)
    terms, clipped = [], []
    for i in range(len(dsm)):
        ratio = torch.exp(old_dsm[i] - dsm[i].detach())
        clip = clip_range > 0 and bool(
            (adv[i] > 0 and ratio > 1 + clip_range) or (adv[i] < 0 and ratio < 1 - clip_range)
        )
        clipped.append(clip)
        terms.append(weights[i] * adv[i] * (dsm[i].detach() if clip else dsm[i]))
    policy = torch.stack(terms).mean()
    kl = ((t["policy_pred"] - t["ref_pred"]) ** 2).mean()
    loss = policy + ref_kl_coef * kl
    metrics = {
        "policy_loss": policy.item(),
        "kl_loss": kl.item(),
        "dsm_loss": dsm.mean().item(),
        "clip_frac": sum(clipped) / len(clipped),
        "group_weight_mean": weights.mean().item(),
        "group_weight_dev": (weights - 0.5).abs().mean().item(),
    }
    return loss, metrics


def main():
    g = torch.Generator().manual_seed(37)
    shape = (8, 4, 3, 3)
    x0 = torch.randn(shape, generator=g)
    noise = torch.randn(shape, generator=g)
    target = noise - x0

    def prediction(scale):
        return target + scale * torch.randn(shape, generator=g)

    base = {
        "x0": x0,
        "noise": noise,
        "policy_pred": prediction(0.5),
        "ref_pred": prediction(0.5),
        "advantages": torch.tensor([1.2, -0.4, -0.8, 6.0, -6.0, 0.3, 0.9, -1.2]),
        "groups": torch.tensor([0, 0, 0, 1, 1, 2, 2, 2]),
    }
    # Near the policy for some rows, far for others, so the clip fires in both directions.
    base["old_pred"] = base["policy_pred"] + torch.randn(shape, generator=g) * torch.tensor(
        [0.01, 0.3, 0.3, 0.01, 0.3, 0.01, 0.3, 0.01]
    ).view(-1, 1, 1, 1)
    tensors = dict(base)
    cases = []
    for i, (beta, clip_range, ref_kl_coef, adv_clip_max) in enumerate(
        [(100.0, 0.0, 0.0, 5.0), (100.0, 0.01, 0.02, 5.0), (10.0, 0.05, 0.02, 1.0), (1000.0, 0.01, 0.0, 5.0)]
    ):
        t = {k: v.clone() for k, v in base.items()}
        t["policy_pred"].requires_grad_(True)
        loss, metrics = dgpo(t, beta, clip_range, ref_kl_coef, adv_clip_max)
        loss.backward()
        tensors[f"case{i}.grad_policy_pred"] = t["policy_pred"].grad
        cases.append(
            {
                "beta": beta,
                "clip_range": clip_range,
                "ref_kl_coef": ref_kl_coef,
                "adv_clip_max": adv_clip_max,
                "value": loss.item(),
                **metrics,
            }
        )
    save_file({k: v.contiguous() for k, v in tensors.items()}, OUT / "dgpo.safetensors")
    (OUT / "dgpo.json").write_text(json.dumps({"cases": cases}, indent=1) + "\n")
    print(json.dumps(cases, indent=1))


if __name__ == "__main__":
    main()
