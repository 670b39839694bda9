"""DGPO fixtures: a PyTorch reimplementation of the reference's loss (DGPO's
`scripts/train_sd3_dgpo.py`, `compute_group_dgpo_loss_allreduce` with its PPO-style clip, as
verl-omni's `DGPOLoss` documents it), written one group at a time.

    PYTHONPATH=/tmp/pylib ~/.cache/flowtune/venv/bin/python scripts/reference_dgpo.py

Needs torch, safetensors and numpy; no GPU, no network. Deterministic. Writes `fixtures/dgpo.json`
and `fixtures/dgpo.safetensors`. Two input sets of `x0`, `noise`, `policy_pred`, `old_pred`,
`ref_pred` [B, 4, 3, 3], `advantages` [B], `groups` [B] (int64): the plain names (groups of 3, 2
and 3 rows) and `unequal.<name>` (groups of 4, 3 and 2 rows, the second of equal rewards: A = 0).
Per case: `inputs` (the name prefix), `beta`, `clip_range`, `ref_kl_coef`, `adv_clip_max`, the
expected `value`, metrics (`policy_loss`, `kl_loss`, `dsm_loss`, `clip_frac`, `group_weight_mean`,
`group_weight_dev`) and `case<i>.grad_policy_pred`.

Metrics as the reference computes them: `clip_frac` is the mean of its `should_clip =
where(A > 0, ρ > 1 + ε_c, ρ < 1 − ε_c)` (logged as `clip_ratio_total`), so an A = 0 row counts
when its ratio fell; `kl_loss`, `policy_loss` and `dsm_loss` are its names; the group weight is
averaged over rows, as the authors' later copy of `compute_group_dgpo_loss_allreduce` (TDM-R1)
returns `local_weights.mean()`.
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
        clip = clip_range > 0 and bool(ratio > 1 + clip_range if adv[i] > 0 else ratio < 1 - clip_range)
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

    def inputs(rows, advantages, groups):
        shape = (rows, 4, 3, 3)
        x0 = torch.randn(shape, generator=g)
        noise = torch.randn(shape, generator=g)
        target = noise - x0
        return target, {
            "x0": x0,
            "noise": noise,
            "policy_pred": target + 0.5 * torch.randn(shape, generator=g),
            "ref_pred": target + 0.5 * torch.randn(shape, generator=g),
            "advantages": torch.tensor(advantages),
            "groups": torch.tensor(groups),
        }

    _, base = inputs(8, [1.2, -0.4, -0.8, 6.0, -6.0, 0.3, 0.9, -1.2], [0, 0, 0, 1, 1, 2, 2, 2])
    # Near the policy for some rows, far for others, so the clip fires in both directions.
    base["old_pred"] = base["policy_pred"] + torch.randn(base["x0"].shape, generator=g) * torch.tensor(
        [0.01, 0.3, 0.3, 0.01, 0.3, 0.01, 0.3, 0.01]
    ).view(-1, 1, 1, 1)
    # Groups of 4, 3 and 2 rows (a group that lost rows); the second has equal rewards, A = 0.
    target, unequal = inputs(9, [1.3, -0.2, 0.6, -1.7, 0.0, 0.0, 0.0, 0.9, -0.9], [0, 0, 0, 0, 1, 1, 1, 2, 2])
    # The old error is the policy's scaled by f²: ρ > 1 where f > 1, ρ < 1 where f < 1, so rows of
    # every advantage sign, A = 0 ones among them, fall on both sides of the trust region.
    f = torch.tensor([1.2, 1.0, 0.9, 0.8, 0.8, 1.2, 0.85, 1.0, 1.15]).view(-1, 1, 1, 1)
    unequal["old_pred"] = target + (unequal["policy_pred"] - target) * f
    sets = {"": base, "unequal.": unequal}
    tensors = {prefix + k: v for prefix, t in sets.items() for k, v in t.items()}
    cases = []
    for i, (prefix, beta, clip_range, ref_kl_coef, adv_clip_max) in enumerate(
        [
            ("", 100.0, 0.0, 0.0, 5.0),
            ("", 100.0, 0.01, 0.02, 5.0),
            ("", 10.0, 0.05, 0.02, 1.0),
            ("", 1000.0, 0.01, 0.0, 5.0),
            ("unequal.", 100.0, 0.01, 0.02, 5.0),
            ("unequal.", 100.0, 0.0, 0.0, 5.0),
        ]
    ):
        t = {k: v.clone() for k, v in sets[prefix].items()}
        t["policy_pred"].requires_grad_(True)
        loss, metrics = dgpo(t, beta, clip_range, ref_kl_coef, adv_clip_max)
        loss.backward()
        tensors[f"case{i}.grad_policy_pred"] = t["policy_pred"].grad
        cases.append(
            {
                "inputs": prefix,
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
