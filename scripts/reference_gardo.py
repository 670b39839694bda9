"""GARDO fixtures: a PyTorch/numpy reimplementation of the reference's formulas (flow_grpo's
`scripts/train_sd3_gardo.py` and `flow_grpo/stat_tracking.py`, type 'gardo').

    PYTHONPATH=/tmp/pylib ~/.cache/flowtune/venv/bin/python scripts/reference_gardo.py

Needs torch, numpy and safetensors; no GPU, no network. Deterministic (fixed seeds). Writes
`fixtures/gardo.json` and `fixtures/gardo.safetensors`:

- `advantages`: per case, `rewards` [B], `groups` [B] (prompt ids), the feature rows
  `adv<i>.features` [B, D] (f32, in the safetensors) and the expected `advantages` [B] and
  `distances` [B] (nearest-neighbour cosine distance within the group).
- `gate`: a sequence of steps, each with the trained reward and two proxy rewards [B], and the
  expected share `kl_perc` after the step's update and the `gate` [B] (bool).
- `losses`: per case, settings (`clip_ratio`, `adv_clip_max`, `kl_loss_coef`), the gate
  `loss<i>.gate` and the shared inputs `log_prob`, `old_log_prob`, `advantages` [B], `std_dev_t`
  [B], `prev_sample_mean`, `anchor_prev_sample_mean` [B, C, H, W]; expected `value`, metrics
  (`pg_loss`, `kl_loss`, `pg_clipfrac`, `ratio_mean`, `ppo_kl`) and the gradients
  `loss<i>.grad_log_prob`, `loss<i>.grad_prev_sample_mean`.
"""

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "fixtures"


def gardo_advantages(prompts, rewards, dists):
    """The per-prompt tracker of the reference with type 'gardo' (one call, a 1-column reward)."""
    prompts = np.array(prompts)
    rewards = np.array(rewards, dtype=np.float64)[:, None]
    dists = np.array(dists)
    dists = dists / np.linalg.norm(dists, ord=2, axis=1, keepdims=True)
    advantages = np.zeros_like(rewards)
    nearest = np.zeros(len(prompts))
    for prompt in np.unique(prompts):
        sel = prompts == prompt
        group = rewards[sel]
        mean = np.mean(group, axis=0, keepdims=True)
        if sel.sum() == 1:
            # numpy's min over an empty row raises in the reference; the centred reward is 0.
            continue
        feats = dists[sel]
        distance = 1 - np.dot(feats, feats.T).clip(-1, 1)
        d = np.array([np.min(np.delete(distance[i], i)) for i in range(len(distance))])
        nearest[sel] = d
        w = np.repeat(d[:, None], group.shape[-1], axis=1)
        w = np.where((group - mean) < 0, np.ones_like(w), w / np.mean(w))
        advantages[sel] = (group - mean) * w
    return advantages[:, 0], nearest


class RiskCompensator:
    """The reference's controller of the gated share."""

    def __init__(self, base=0.1):
        self.buffer, self.base, self.alpha, self.beta = [], base, 0.1, base

    def update(self, scores):
        if len(self.buffer) == 0:
            self.beta = self.base
        elif np.mean(scores) > max(self.buffer):
            self.beta = self.beta * (1 + self.alpha)
        elif np.mean(scores) < min(self.buffer):
            self.beta = self.beta * (1 - self.alpha)
        self.beta = float(np.clip(self.beta, 0.02, 0.2))
        self.buffer.append(np.mean(scores))
        self.buffer = self.buffer[-20:]


def ranks(values):
    values = torch.tensor(values, dtype=torch.float64)
    # Stable, so ties keep their order (flowtune's rule; the reference's sort is unstable).
    _, idx = torch.sort(values, descending=True, stable=True)
    r = torch.empty_like(values, dtype=torch.long)
    r[idx] = torch.arange(1, len(values) + 1)
    return r.double()


def gate_step(controller, main, proxies):
    u = ranks(main) - sum(ranks(p) for p in proxies) / len(proxies)
    nonneg = np.array([p for p in u.numpy() if p >= 0])
    controller.update(nonneg)
    threshold = np.percentile(nonneg, 100 - controller.beta * 100)
    return (u.numpy() > threshold).tolist()


def gardo_loss(t, gate, clip_ratio, adv_clip_max, beta):
    """One trained step of the reference's GARDO update, std_dev_t shaped (B, 1, 1, 1)."""
    std = t["std_dev_t"].reshape(-1, 1, 1, 1)
    adv = torch.clamp(t["advantages"], -adv_clip_max, adv_clip_max)
    ratio = torch.exp(t["log_prob"] - t["old_log_prob"])
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
    policy = (std[:, 0, 0, 0] / torch.mean(std[:, 0, 0, 0])) * torch.maximum(unclipped, clipped)
    kl = torch.zeros(())
    if True in gate:
        idx = gate
        kl = torch.mean(
            torch.square(t["prev_sample_mean"][idx] - t["anchor_prev_sample_mean"][idx])
            / (2 * std[idx] ** 2)
        )
    loss = torch.mean(policy) + beta * kl
    metrics = {
        "pg_loss": torch.mean(policy).item(),
        "kl_loss": kl.item(),
        "pg_clipfrac": torch.mean((torch.abs(ratio - 1.0) > clip_ratio).float()).item(),
        "ratio_mean": ratio.mean().item(),
        "ppo_kl": torch.mean(t["old_log_prob"] - t["log_prob"]).item(),
    }
    return loss, metrics


def main():
    rng = np.random.default_rng(37)
    torch.manual_seed(37)
    tensors, spec = {}, {"advantages": [], "gate": [], "losses": []}

    # advantages: three groups of 4, one of 1; and one case with two identical features.
    groups = [0, 0, 1, 0, 1, 1, 2, 2, 2, 2, 1, 0, 3]
    rewards = rng.normal(size=len(groups)).round(4).tolist()
    feats = rng.normal(size=(len(groups), 6)).astype(np.float32)
    twin = [0, 0, 0, 1, 1]
    twin_feats = rng.normal(size=(5, 6)).astype(np.float32)
    twin_feats[1] = twin_feats[0] * 2.0
    for i, (g, r, f) in enumerate(
        [(groups, rewards, feats), (twin, [0.1, 0.9, 0.5, 0.2, 0.4], twin_feats)]
    ):
        adv, nearest = gardo_advantages(g, r, f)
        tensors[f"adv{i}.features"] = torch.from_numpy(f)
        spec["advantages"].append(
            {"groups": g, "rewards": r, "advantages": adv.tolist(), "distances": nearest.tolist()}
        )

    # gate: 6 steps of 12 samples with a drifting level of disagreement.
    controller = RiskCompensator()
    for step in range(6):
        main = rng.normal(size=12)
        proxies = [main * (0.2 * step) + rng.normal(size=12) for _ in range(2)]
        gate = gate_step(controller, main, proxies)
        spec["gate"].append(
            {
                "main": main.tolist(),
                "proxies": [p.tolist() for p in proxies],
                "kl_perc": controller.beta,
                "gate": gate,
            }
        )

    # losses: B = 6 rows of (4, 3, 3).
    b, shape = 6, (6, 4, 3, 3)
    base = {
        "log_prob": torch.randn(b) * 0.01,
        "advantages": torch.tensor([1.3, -0.4, 7.0, -0.2, 0.0, -6.5]),
        "std_dev_t": torch.rand(b) * 0.5 + 0.3,
        "prev_sample_mean": torch.randn(shape),
    }
    base["old_log_prob"] = base["log_prob"] + torch.randn(b) * 1e-4
    base["anchor_prev_sample_mean"] = base["prev_sample_mean"] + torch.randn(shape) * 0.05
    tensors.update({k: v.contiguous() for k, v in base.items()})
    cases = [
        ([True, False, False, True, False, True], 1e-4, 5.0, 0.04),
        ([False] * 6, 1e-4, 5.0, 0.04),
        ([True] * 6, 1e-5, 2.0, 1.0),
    ]
    for i, (gate, clip_ratio, adv_clip_max, beta) in enumerate(cases):
        t = {k: v.clone().requires_grad_(k in ("log_prob", "prev_sample_mean")) for k, v in base.items()}
        loss, metrics = gardo_loss(t, torch.tensor(gate), clip_ratio, adv_clip_max, beta)
        loss.backward()
        tensors[f"loss{i}.gate"] = torch.tensor(gate)
        tensors[f"loss{i}.grad_log_prob"] = t["log_prob"].grad
        grad = t["prev_sample_mean"].grad  # None when no row is gated
        tensors[f"loss{i}.grad_prev_sample_mean"] = torch.zeros(shape) if grad is None else grad
        spec["losses"].append(
            {
                "clip_ratio": clip_ratio,
                "adv_clip_max": adv_clip_max,
                "kl_loss_coef": beta,
                "value": loss.item(),
                **metrics,
            }
        )

    OUT.mkdir(exist_ok=True)
    save_file(tensors, OUT / "gardo.safetensors")
    (OUT / "gardo.json").write_text(json.dumps(spec, indent=1) + "\n")
    print(f"wrote {len(tensors)} tensors and {sum(map(len, spec.values()))} cases")


if __name__ == "__main__":
    main()
