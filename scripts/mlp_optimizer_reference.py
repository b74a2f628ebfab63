#!/usr/bin/python3
# References for the example's MLP (examples/mlp.h: x W + b per layer, ReLU between, mean softmax
# cross-entropy) trained with Muon + AdamW and with Adafactor, computed with PyTorch (Debian's
# python3-torch, float32 on the CPU, one process) from the published algorithms, not from the
# library. examples/mlp_optimizer_test.cc trains the MLP by the engine on 1, 2 and 3 ranks at stages
# 0-3 and compares. Writes examples/testdata/mlp_optimizer_reference.json:
#
#   /usr/bin/python3 scripts/mlp_optimizer_reference.py
#
# The run: 6 data-parallel reference ranks (so 1, 2, 3 and 6 engine ranks divide them, each taking
# 6 / N of them as micro-batches), 4 samples each per step, 5 steps; the gradients averaged over the
# ranks and clipped to a global norm of 1 (torch.nn.utils.clip_grad_norm_), then the optimizer steps.
# Muon + AdamW: every weight in Muon (m = 0.95 m + g; W = W (1 - lr wd) - lr 0.2 sqrt(max(rows,
# cols)) newton_schulz(m); rows = fan_in, as the MLP stores W [fan_in, fan_out]), the biases in
# torch.optim.AdamW. Adafactor (the paper's, with Hugging Face's first moment where beta1 > 0): the
# weights factored, lr 0.01, weight decay 0.1, beta1 0.9; the biases unfactored at the relative step.
import json
import math
import os

import numpy
import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "testdata",
                   "mlp_optimizer_reference.json")
WIDTHS = [16, 32, 32, 8]
WORLD, BATCH, STEPS, MAX_NORM = 6, 4, 5, 1.0
A, B, C = 3.4445, -4.7750, 2.0315


def listed(t):
    # Each float32 as its shortest round-trip decimal (a JSON number that parses back to the same bits).
    return [float(numpy.format_float_positional(x, unique=True, trim="-")) for x in t.detach().flatten().numpy()]


def mlp_loss(p, x, labels):
    h = x
    layers = len(WIDTHS) - 1
    for l in range(layers):
        h = h @ p[f"layer{l}.weight"] + p[f"layer{l}.bias"]
        if l + 1 < layers:
            h = h.clamp(min=0)
    return F.cross_entropy(h, labels)


def newton_schulz(g, steps=5, eps=1e-7):
    x = g.clone()
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / (x.norm() + eps)
    for _ in range(steps):
        a = x @ x.T
        x = A * x + (B * a + C * (a @ a)) @ x
    return x.T if tall else x


def adamw(params, names_by_group, groups):
    return torch.optim.AdamW(
        [{"params": [params[n] for n in names_by_group[k]], "lr": h["lr"], "weight_decay": h["weight_decay"],
          "betas": tuple(h["betas"]), "eps": h["eps"]} for k, h in enumerate(groups) if h["kind"] == "adamw"])


class Muon:
    def __init__(self, params, names_by_group, groups):
        self.params, self.groups = params, groups
        self.muon = {n: k for k, h in enumerate(groups) if h["kind"] == "muon" for n in names_by_group[k]}
        self.momentum = {n: torch.zeros_like(params[n]) for n in self.muon}
        self.rest = adamw(params, names_by_group, groups)

    @torch.no_grad()
    def step(self):
        for n, k in self.muon.items():
            h, p, m = self.groups[k], self.params[n], self.momentum[n]
            m.mul_(h["momentum"]).add_(p.grad)
            rows, cols = p.shape
            p.mul_(1 - h["lr"] * h["weight_decay"])
            p.add_(newton_schulz(m), alpha=-h["lr"] * h["rms_scale"] * math.sqrt(max(rows, cols)))
        self.rest.step()


class Adafactor:
    def __init__(self, params, names_by_group, groups):
        self.params, self.groups, self.t = params, groups, 0
        self.group_of = {n: k for k, names in enumerate(names_by_group) for n in names}
        self.state = {}
        for n, p in params.items():
            st = {"R": torch.zeros(p.shape[0]), "C": torch.zeros(p.shape[1])} if p.dim() == 2 else {"V": torch.zeros_like(p)}
            if groups[self.group_of[n]]["beta1"] > 0:
                st["M"] = torch.zeros_like(p)
            self.state[n] = st

    @torch.no_grad()
    def step(self):
        self.t += 1
        for n, p in self.params.items():
            h, st, g = self.groups[self.group_of[n]], self.state[n], self.params[n].grad
            beta = 1.0 - self.t ** -h["decay_rate"]
            s = g * g + h["eps1"]
            if "R" in st:
                st["R"] = st["R"] * beta + s.double().sum(dim=1).float() * (1 - beta)
                st["C"] = st["C"] * beta + s.double().sum(dim=0).float() * (1 - beta)
                v = (st["R"][:, None] * st["C"][None, :]) / st["R"].double().sum().float()
            else:
                st["V"] = st["V"] * beta + s * (1 - beta)
                v = st["V"]
            u = g / v.sqrt()
            rms_u = math.sqrt(float((u.double() ** 2).sum()) / u.numel())
            rms_x = math.sqrt(float((p.double() ** 2).sum()) / p.numel())
            alpha = max(h["eps2"], rms_x) * min(1e-2, 1 / math.sqrt(self.t)) if h["relative_step"] else h["lr"]
            update = u * (alpha / max(1.0, rms_u / h["clip_threshold"]))
            if "M" in st:
                st["M"] = st["M"] * h["beta1"] + update * (1 - h["beta1"])
                update = st["M"]
            p.mul_(1 - alpha * h["weight_decay"])
            p.sub_(update)


ADAFACTOR = {"kind": "adafactor", "eps1": 1e-30, "eps2": 1e-3, "clip_threshold": 1.0, "decay_rate": 0.8}
ADAMW = {"kind": "adamw", "betas": [0.9, 0.95], "eps": 1e-8}


def main():
    torch.manual_seed(20261206)
    names, initial = [], {}
    for l in range(len(WIDTHS) - 1):
        bound = math.sqrt(6.0 / WIDTHS[l])
        initial[f"layer{l}.weight"] = (torch.rand(WIDTHS[l], WIDTHS[l + 1]) * 2 - 1) * bound
        initial[f"layer{l}.bias"] = (torch.rand(WIDTHS[l + 1]) * 2 - 1) * 0.01
        names += [f"layer{l}.weight", f"layer{l}.bias"]
    batches = [[(torch.randn(BATCH, WIDTHS[0]), torch.randint(0, WIDTHS[-1], (BATCH,))) for _ in range(WORLD)]
               for _ in range(STEPS)]
    weights = [n for n in names if n.endswith(".weight")]
    biases = [n for n in names if n.endswith(".bias")]
    recipes = {
        "muon": ([weights, biases],
                 [{"kind": "muon", "lr": 0.02, "weight_decay": 0.1, "momentum": 0.95, "nesterov": False,
                   "rms_scale": 0.2}, dict(ADAMW, lr=0.01, weight_decay=0.0)], Muon),
        "adafactor": ([weights, biases],
                      [dict(ADAFACTOR, lr=0.01, weight_decay=0.1, relative_step=False, beta1=0.9),
                       dict(ADAFACTOR, lr=0.01, weight_decay=0.0, relative_step=True, beta1=0.0)], Adafactor),
    }
    doc = {
        "torch_version": torch.__version__, "widths": WIDTHS, "world_size": WORLD, "batch_per_rank": BATCH,
        "steps": STEPS, "max_grad_norm": MAX_NORM,
        "params": [{"name": n, "shape": list(initial[n].shape)} for n in names],
        "initial_params": {n: listed(t) for n, t in initial.items()},
        "inputs_per_step_per_rank": [[listed(x) for x, _ in step] for step in batches],
        "labels_per_step_per_rank": [[y.tolist() for _, y in step] for step in batches],
        "runs": {},
    }
    for label, (names_by_group, groups, optimizer) in recipes.items():
        params = {n: initial[n].clone().requires_grad_() for n in names}
        opt = optimizer(params, names_by_group, groups)
        losses, norms, after = [], [], []
        for step in range(STEPS):
            grads = {n: torch.zeros_like(params[n]) for n in names}
            step_losses = []
            for x, y in batches[step]:
                loss = mlp_loss(params, x, y)
                step_losses.append(float(loss))
                for n, g in zip(names, torch.autograd.grad(loss, [params[n] for n in names])):
                    grads[n] += g
            losses.append(step_losses)
            for n in names:
                params[n].grad = grads[n] / WORLD
            norms.append(float(torch.nn.utils.clip_grad_norm_([params[n] for n in names], MAX_NORM)))
            opt.step()
            after.append({n: listed(params[n]) for n in names})
        doc["runs"][label] = {
            "param_groups": [{"names": ns, **h} for ns, h in zip(names_by_group, groups)],
            "loss_per_step_per_rank": losses, "grad_norm_before_clip": norms, "params_after_step": after,
        }
        print(f"{label}: losses {[round(sum(l) / WORLD, 4) for l in losses]}, norms {[round(x, 4) for x in norms]}")
    with open(OUT, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
