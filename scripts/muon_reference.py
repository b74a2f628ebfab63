#!/usr/bin/python3
# The Muon reference for optim/newton_schulz_test.cc and zero/muon_engine_test.cc, computed with
# PyTorch tensors (Debian's python3-torch, float32 on the CPU) from the published algorithm
# (Moonlight, arXiv 2502.16982, its Muon with the update scaled to AdamW's RMS), not from the
# library. Writes optim/testdata/muon_reference.json:
#
#   /usr/bin/python3 scripts/muon_reference.py [OUT]
#
# newton_schulz: X = G / (||G||_F + 1e-7), transposed when rows > cols; five times
#   A = X X^T;  X = a X + (b A + c A A) X   with (a, b, c) = (3.4445, -4.7750, 2.0315); in fp32, and
#   in bf16 for "bf16_cases" (every operation's result rounded to bfloat16, products summed in fp32).
# Training: Moonlight's hybrid. Matrices (and a 3-D tensor, as shape[0] x the rest) in Muon groups,
# per step t and matrix W with g the averaged, clipped gradient:
#   m = mu m + g;  u = nesterov ? g + mu m : m;  O = newton_schulz(u)
#   W = W (1 - lr wd) - lr 0.2 sqrt(max(rows, cols)) O
# the rest (embedding, biases, a norm's gain) in torch.optim.AdamW groups. Two data-parallel ranks
# whose gradients are averaged, then clipped to a global norm of 1 (torch.nn.utils.clip_grad_norm_).
import json
import math
import sys

import torch

from reference_optimizers import A, B, C, listed, newton_schulz, newton_schulz_bf16

torch.manual_seed(20261206)
OUT = sys.argv[1] if len(sys.argv) > 1 else "optim/testdata/muon_reference.json"
WORLD, STEPS, MAX_NORM = 2, 5, 1.0


ns_cases = []
for rows, cols, steps in [(8, 8, 5), (6, 20, 5), (24, 5, 5), (16, 48, 5), (12, 12, 3)]:
    g = torch.randn(rows, cols, dtype=torch.float32) * 0.1
    ns_cases.append({"rows": rows, "cols": cols, "steps": steps, "input": listed(g),
                     "output": listed(newton_schulz(g, steps))})

# name, shape, group. Groups: 0 Muon, 1 Muon with Nesterov and its own lr, 2 AdamW with decay,
# 3 AdamW without.
PARAMS = [("emb", [40, 16], 2), ("h0.w", [16, 32], 0), ("h0.b", [32], 3), ("h1.w", [32, 16], 0),
          ("h1.b", [16], 3), ("h2.w", [48, 16], 1), ("conv.w", [8, 4, 3], 0), ("ln.g", [16], 3)]
GROUPS = [{"kind": "muon", "lr": 0.02, "weight_decay": 0.1, "momentum": 0.95, "nesterov": False},
          {"kind": "muon", "lr": 0.01, "weight_decay": 0.0, "momentum": 0.9, "nesterov": True},
          {"kind": "adamw", "lr": 0.01, "weight_decay": 0.01, "betas": [0.9, 0.95], "eps": 1e-8},
          {"kind": "adamw", "lr": 0.01, "weight_decay": 0.0, "betas": [0.9, 0.95], "eps": 1e-8}]

params = {name: torch.nn.Parameter(torch.randn(shape, dtype=torch.float32) * 0.2) for name, shape, _ in PARAMS}
initial = {name: listed(p) for name, p in params.items()}
adamw = torch.optim.AdamW(
    [{"params": [params[n] for n, _, g in PARAMS if g == k], "lr": GROUPS[k]["lr"],
      "weight_decay": GROUPS[k]["weight_decay"], "betas": tuple(GROUPS[k]["betas"]), "eps": GROUPS[k]["eps"]}
     for k in (2, 3)])
momentum = {n: torch.zeros_like(params[n]) for n, _, g in PARAMS if GROUPS[g]["kind"] == "muon"}

grads, after, norms = [], [], []
for step in range(STEPS):
    per_rank = [{n: torch.randn(s, dtype=torch.float32) * (0.3 + 0.2 * r) for n, s, _ in PARAMS} for r in range(WORLD)]
    grads.append([{n: listed(g) for n, g in rank.items()} for rank in per_rank])
    for n, _, _ in PARAMS:
        params[n].grad = (per_rank[0][n] + per_rank[1][n]) / 2
    norms.append(float(torch.nn.utils.clip_grad_norm_([params[n] for n, _, _ in PARAMS], MAX_NORM)))
    with torch.no_grad():
        for n, shape, k in PARAMS:
            h = GROUPS[k]
            if h["kind"] != "muon":
                continue
            p, g, m = params[n], params[n].grad, momentum[n]
            m.mul_(h["momentum"]).add_(g)
            u = g.add(m, alpha=h["momentum"]) if h["nesterov"] else m
            rows, cols = shape[0], math.prod(shape[1:])
            o = newton_schulz(u.reshape(rows, cols)).reshape(shape)
            p.mul_(1 - h["lr"] * h["weight_decay"])
            p.add_(o, alpha=-h["lr"] * 0.2 * math.sqrt(max(rows, cols)))
    adamw.step()
    after.append({n: listed(p) for n, p in params.items()})

doc = {
    "newton_schulz": {"coefficients": [A, B, C], "eps": 1e-7, "cases": ns_cases},
    "training": {
        "world_size": WORLD, "steps": STEPS, "max_grad_norm": MAX_NORM, "rms_scale": 0.2,
        "params": [{"name": n, "shape": s, "group": g} for n, s, g in PARAMS],
        "groups": GROUPS,
        "initial_params": initial,
        "grads_per_step_per_rank": grads,
        "grad_norm_before_clip": norms,
        "params_after_step": after,
    },
}
# Newton-Schulz in bf16 (the option NewtonSchulzOptions::bf16), from a generator of its own so the
# cases above keep their values.
gen = torch.Generator().manual_seed(7)
bf16_cases = []
for rows, cols in [(8, 8), (24, 5), (16, 48), (64, 96)]:
    g = torch.randn(rows, cols, generator=gen, dtype=torch.float32) * 0.1
    bf16_cases.append({"rows": rows, "cols": cols, "steps": 5, "input": listed(g),
                       "output": listed(newton_schulz_bf16(g, 5))})
doc["newton_schulz"]["bf16_cases"] = bf16_cases

with open(OUT, "w") as f:
    json.dump(doc, f, separators=(",", ":"))
    f.write("\n")
print(f"wrote {OUT}")
