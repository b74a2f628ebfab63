#!/usr/bin/python3
# The LAMB reference for examples/lamb_test.cc, computed with PyTorch tensors (Debian's python3-torch,
# float32 on the CPU): LAMB as Algorithm 2 of You et al. 2019 ("Large Batch Optimization for Deep
# Learning: Training BERT in 76 minutes") with bias correction and phi the identity, data-parallel
# over two ranks whose gradients are averaged. Writes examples/testdata/lamb_reference.json:
#
#   /usr/bin/python3 scripts/lamb_reference.py [OUT]
#
# Per tensor and step t (from 1), with g the averaged gradient and x the parameter:
#   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
#   r = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
#   u = r + wd x
#   trust = ||x|| / ||u||, or 1 where either norm is 0
#   x = x - lr trust u
import json
import math
import sys

import numpy
import torch

torch.manual_seed(20261203)
OUT = sys.argv[1] if len(sys.argv) > 1 else "examples/testdata/lamb_reference.json"
WORLD, STEPS = 2, 6
LR, B1, B2, EPS = 0.01, 0.9, 0.999, 1e-6
# Shapes that differ in size by orders of magnitude, so whole-tensor ownership pads, and a zero
# tensor, whose trust ratio is 1 by the rule's definition.
PARAMS = [("emb", [40, 16]), ("h0.w", [16, 16]), ("h0.b", [16]), ("h1.w", [16, 48]), ("h1.b", [48]),
          ("ln.g", [16]), ("zero.b", [8])]
DECAY = {"emb": 0.01, "h0.w": 0.01, "h1.w": 0.01}  # the rest: none


def listed(t):
    # Each float32 as its shortest round-trip decimal (a JSON number that parses back to the same bits).
    return [float(numpy.format_float_positional(x, unique=True, trim="-")) for x in t.flatten().numpy()]


def values(shape, scale):
    return (torch.randn(shape, dtype=torch.float32) * scale).contiguous()


params = {}
for name, shape in PARAMS:
    params[name] = torch.zeros(shape, dtype=torch.float32) if name == "zero.b" else values(shape, 0.2)
initial = {n: listed(p) for n, p in params.items()}
m = {n: torch.zeros_like(p) for n, p in params.items()}
v = {n: torch.zeros_like(p) for n, p in params.items()}

grads_per_step_per_rank, after, trust_per_step = [], [], []
for t in range(1, STEPS + 1):
    per_rank = [{n: values(p.shape, 0.05 * (r + 1)) for n, p in params.items()} for r in range(WORLD)]
    grads_per_step_per_rank.append([{n: listed(g) for n, g in rank.items()} for rank in per_rank])
    trust = {}
    for name, x in params.items():
        g = sum(rank[name] for rank in per_rank) / WORLD
        m[name] = B1 * m[name] + (1 - B1) * g
        v[name] = B2 * v[name] + (1 - B2) * g * g
        r = (m[name] / (1 - B1 ** t)) / ((v[name] / (1 - B2 ** t)).sqrt() + EPS)
        u = r + DECAY.get(name, 0.0) * x
        wn, un = x.norm().item(), u.norm().item()
        ratio = wn / un if wn > 0 and un > 0 else 1.0
        trust[name] = ratio
        params[name] = x - LR * ratio * u
    trust_per_step.append(trust)
    after.append({n: listed(p) for n, p in params.items()})

with open(OUT, "w") as f:
    json.dump({
        "optimizer": "LAMB (You et al. 2019, Algorithm 2, bias-corrected, phi = identity)",
        "torch_version": torch.__version__,
        "world_size": WORLD, "steps": STEPS, "lr": LR, "betas": [B1, B2], "eps": EPS,
        "params": [{"name": n, "shape": s} for n, s in PARAMS],
        "weight_decay": {n: DECAY.get(n, 0.0) for n, _ in PARAMS},
        "initial_params": initial,
        "grads_per_step_per_rank": grads_per_step_per_rank,
        "trust_ratio_per_step": trust_per_step,
        "params_after_step": after,
    }, f)
print(f"wrote {OUT}: {len(PARAMS)} tensors, {STEPS} steps, {WORLD} ranks (torch {torch.__version__})")
