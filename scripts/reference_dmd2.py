"""DMD2 fixtures: a PyTorch writing of `docs/spec/algorithms.md` §9 (the distribution-matching
gradient and surrogate loss, the fake score's denoising loss, the teacher's guidance, the student's
grid and the scored noise levels), and, with `--verl-utils`, the same values from VeRL-Omni's own
functions called on the same tensors.

    PYTHONPATH=/tmp/pylib ~/.cache/flowtune/venv/bin/python scripts/reference_dmd2.py \
        [--verl-utils <verl-omni>/verl_omni/trainer/diffusion/distillation/utils.py]

`--verl-utils` loads that file alone (it needs torch only) and checks that its `dmd_gradient`,
`dmd_surrogate_loss`, `fake_score_loss`, `standard_cfg` and `timestep_shift` give this script's
values to 1e-6; its outputs are stored as `verl.<name>` beside them, and `verl` in the JSON
records the check. Needs torch, safetensors and numpy; no GPU, no network. Deterministic. Writes
`fixtures/dmd2.json` and `fixtures/dmd2.safetensors`:

- inputs `x` (the student's clean prediction), `x_fake`, `x_real` [B, 4, 3, 3]; `velocity`,
  `noise` [B, 4, 3, 3] (the fake score's); `cond`, `uncond` [B, 6, 8] (packed tokens);
- per DMD case (`eps`): `case<i>.g`, `case<i>.normalizer` [B], `case<i>.grad_x` and in the JSON
  `loss`, `nonfinite` (case 2 puts two NaNs into `x_fake`; an inf would become float32 max and overflow the loss);
- `fake.loss` (JSON), `fake.grad_velocity`;
- `cfg.none`, `cfg.layer_norm` at scale 4 over the last dimension;
- the student grids (`student_sigmas`: steps, shift → sigmas) and scored noise levels
  (`score_sigmas`: t of 1000 at shift 3, clamped to [0.02, 0.98]).
"""

import argparse
import importlib.util
import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent.parent / "fixtures"


def dmd_gradient(x_fake, x_real, x, eps):
    x_fake, x_real, x = x_fake.float(), x_real.float(), x.float()
    z = (x - x_real).abs().mean(dim=tuple(range(1, x.ndim)), keepdim=True).clamp_min(eps)
    g = (x_fake - x_real) / z
    nonfinite = int((~torch.isfinite(g)).sum())
    return torch.nan_to_num(g), z.flatten(), nonfinite


def dmd_loss(x, g):
    x = x.float()
    return 0.5 * ((x - (x - g).detach()) ** 2).mean()


def fake_loss(velocity, noise, x):
    return ((velocity.float() - (noise - x).detach()) ** 2).mean()


def cfg(cond, uncond, scale, norm):
    guided = uncond + scale * (cond - uncond)
    if norm == "layer_norm":
        guided = guided * cond.norm(dim=-1, keepdim=True) / guided.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return guided


def student_sigmas(steps, shift):
    x = torch.linspace(1, 0, steps + 1)
    return shift * x / (1 + (shift - 1) * x)


def score_sigmas(t, shift=3.0, lo=0.02, hi=0.98, total=1000):
    f = t.float() / total
    return (shift * f / (1 + (shift - 1) * f) * total / total).clamp(lo, hi)


def load_verl(path):
    spec = importlib.util.spec_from_file_location("verl_dmd_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--verl-utils", type=Path)
    args = parser.parse_args()
    verl = load_verl(args.verl_utils) if args.verl_utils else None
    g = torch.Generator().manual_seed(53)
    shape = (3, 4, 3, 3)
    x = torch.randn(shape, generator=g)
    t = {
        "x": x,
        "x_real": x + 0.3 * torch.randn(shape, generator=g),
        "x_fake": x + 0.3 * torch.randn(shape, generator=g),
        "velocity": torch.randn(shape, generator=g),
        "noise": torch.randn(shape, generator=g),
        "cond": torch.randn((3, 6, 8), generator=g),
        "uncond": torch.randn((3, 6, 8), generator=g),
    }
    bad = t["x_fake"].clone()
    bad[0, 0, 0, 0] = float("nan")
    bad[1, 1, 1, 1] = float("nan")
    t["x_fake_bad"] = bad
    tensors = dict(t)
    cases = []
    for i, (fake_key, eps) in enumerate([("x_fake", 1e-6), ("x_fake", 0.5), ("x_fake_bad", 1e-6)]):
        grad, z, nonfinite = dmd_gradient(t[fake_key], t["x_real"], t["x"], eps)
        student = t["x"].clone().requires_grad_(True)
        loss = dmd_loss(student, grad)
        loss.backward()
        tensors.update({f"case{i}.g": grad, f"case{i}.normalizer": z, f"case{i}.grad_x": student.grad})
        case = {"fake": fake_key, "eps": eps, "loss": loss.item(), "nonfinite": nonfinite}
        if verl:
            vg, vz, vn = verl.dmd_gradient(t[fake_key], t["x_real"], t["x"], eps)
            vstudent = t["x"].clone().requires_grad_(True)
            vloss, _ = verl.dmd_surrogate_loss(vstudent, vg)
            vloss.backward()
            assert vn == nonfinite and torch.allclose(vg, grad, atol=1e-6) and math.isclose(vloss.item(), loss.item(), rel_tol=1e-6)
            tensors.update({f"verl.case{i}.g": vg, f"verl.case{i}.grad_x": vstudent.grad})
            case["verl_loss"] = vloss.item()
        cases.append(case)
    velocity = t["velocity"].clone().requires_grad_(True)
    floss = fake_loss(velocity, t["noise"], t["x"])
    floss.backward()
    tensors["fake.grad_velocity"] = velocity.grad
    fake = {"loss": floss.item()}
    for norm in ["none", "layer_norm"]:
        tensors[f"cfg.{norm}"] = cfg(t["cond"], t["uncond"], 4.0, norm)
    grids = [{"steps": s, "shift": sh, "sigmas": student_sigmas(s, sh).tolist()} for s, sh in [(4, 3.0), (3, 3.0), (2, 1.0)]]
    steps = torch.tensor([0, 1, 6, 7, 250, 500, 731, 999])
    scored = {"t": steps.tolist(), "sigmas": score_sigmas(steps).tolist()}
    if verl:
        vvel = t["velocity"].clone().requires_grad_(True)
        vloss, _ = verl.fake_score_loss(vvel, t["noise"], t["x"])
        vloss.backward()
        assert abs(vloss.item() - floss.item()) < 1e-6
        tensors["verl.fake.grad_velocity"] = vvel.grad
        fake["verl_loss"] = vloss.item()
        for norm in ["none", "layer_norm"]:
            v = verl.standard_cfg(t["cond"], t["uncond"], 4.0, norm)
            assert torch.allclose(v, tensors[f"cfg.{norm}"], atol=1e-6)
            tensors[f"verl.cfg.{norm}"] = v
        for grid in grids:
            v = verl.timestep_shift(torch.linspace(1, 0, grid["steps"] + 1), 1, grid["shift"])
            assert v.tolist() == grid["sigmas"], (v.tolist(), grid)
        v = (verl.timestep_shift(steps, 1000, 3.0) / 1000).clamp(0.02, 0.98)
        assert v.tolist() == scored["sigmas"], (v.tolist(), scored)
    spec = {"cases": cases, "fake": fake, "student_sigmas": grids, "score_sigmas": scored, "verl": verl is not None}
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, OUT / "dmd2.safetensors")
    (OUT / "dmd2.json").write_text(json.dumps(spec, indent=1) + "\n")
    print(json.dumps(spec, indent=1))


if __name__ == "__main__":
    main()
