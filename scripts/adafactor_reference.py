#!/usr/bin/python3
# The Adafactor reference for zero/adafactor_engine_test.cc, written from the paper (Shazeer and
# Stern, ICML 2018, Algorithms 4 and 5 without a first moment) in numpy, not from the library. Writes
# optim/testdata/adafactor_reference.json:
#
#   /usr/bin/python3 scripts/adafactor_reference.py [OUT]      (Debian: python3-numpy)
#
# Per tensor X (a matrix: shape[0] x the rest; a vector) and step t, with G the gradient averaged over
# two ranks and S = G^2 + eps1 (float32):
#   b = 1 - t^-decay_rate
#   matrix: R = R b + float(sum_j S_ij) (1 - b);  C = C b + float(sum_i S_ij) (1 - b)   (sums in float64)
#           V = (R_i C_j) / float(sum_i R_i)
#   vector: V = V b + S (1 - b)
#   U = G / sqrt(V);  U scaled by 1 / max(1, RMS(U) / clip_threshold)     (RMS in float64)
#   alpha = relative_step ? max(eps2, RMS(X)) min(1e-2, 1/sqrt(t)) : lr
#   X = X float(1 - alpha wd) - float(alpha / max(1, RMS(U) / d)) U      (beta1 = 0)
#   M = M float(beta1) + float(1 - beta1) (float(alpha / max(1, RMS(U) / d)) U);  X = X float(1 - alpha wd) - M
#                                                                        (beta1 > 0: Hugging Face's first moment)
# The AdamW group: torch.optim.AdamW's update as PyTorch 1.13 computes it, in float32.
# Inputs come from a formula (pattern(), which the test restates); the file holds the parameters
# after every step.
import json
import math
import sys

import numpy as np

OUT = sys.argv[1] if len(sys.argv) > 1 else "optim/testdata/adafactor_reference.json"
WORLD, STEPS = 2, 5
f32, f64 = np.float32, np.float64


def listed(a):
    return [float(np.format_float_positional(x, unique=True, trim="-")) for x in np.asarray(a, f32).ravel()]


def pattern(seed, n, scale):
    # Multiples of 1/1000 in [-1, 1], times scale, in float32: the same bits in any language.
    i = np.arange(n, dtype=np.int64)
    k = (i * 2654435761 + seed * 40503) % 2003 - 1001
    return k.astype(f32) / f32(1000) * f32(scale)


def fma(a, b, c):
    return (np.asarray(a, f64) * np.asarray(b, f64) + np.asarray(c, f64)).astype(f32)


# name, shape, group. Groups 0 and 1 run Adafactor (1 with the relative step, update clipping at 0.5
# and weight decay), group 2 AdamW. emb's row 0 never gets a gradient.
PARAMS = [("emb", [40, 16], 0), ("h0.w", [16, 32], 0), ("h0.b", [32], 0), ("h1.w", [32, 16], 1),
          ("h1.b", [16], 1), ("conv.w", [8, 4, 3], 0), ("ln.g", [16], 2)]
GROUPS = [{"kind": "adafactor", "lr": 0.01, "weight_decay": 0.0, "eps1": 1e-30, "eps2": 1e-3,
           "clip_threshold": 1.0, "decay_rate": 0.8, "relative_step": False},
          {"kind": "adafactor", "lr": 0.01, "weight_decay": 0.1, "eps1": 1e-30, "eps2": 1e-3,
           "clip_threshold": 0.5, "decay_rate": 0.8, "relative_step": True, "beta1": 0.9},
          {"kind": "adamw", "lr": 0.01, "weight_decay": 0.01, "betas": [0.9, 0.95], "eps": 1e-8}]

params = {n: pattern(1 + t, math.prod(s), 0.2) for t, (n, s, _) in enumerate(PARAMS)}
state = {}
for n, s, g in PARAMS:
    if GROUPS[g]["kind"] == "adamw":
        state[n] = {"m": np.zeros(math.prod(s), f32), "v": np.zeros(math.prod(s), f32)}
    elif len(s) >= 2:
        state[n] = {"R": np.zeros(s[0], f32), "C": np.zeros(math.prod(s[1:]), f32)}
    else:
        state[n] = {"V": np.zeros(s[0], f32)}

after = []
for step in range(1, STEPS + 1):
    per_rank = [{n: pattern(100 * step + 10 * r + t, math.prod(s), 0.3 + 0.2 * r) for t, (n, s, _) in enumerate(PARAMS)}
                for r in range(WORLD)]
    for rank in per_rank:
        rank["emb"][:16] = 0
    for n, shape, k in PARAMS:
        h, st, x = GROUPS[k], state[n], params[n]
        g = (per_rank[0][n] + per_rank[1][n]) / f32(2)
        if h["kind"] == "adamw":
            b1, b2 = h["betas"]
            q = x * f32(1 - h["lr"] * h["weight_decay"])
            st["m"] = fma(g, f32(1 - b1), st["m"] * f32(b1))
            st["v"] = fma(f32(1 - b2) * g, g, st["v"] * f32(b2))
            denom = np.sqrt(st["v"]) / f32(math.sqrt(1 - b2 ** step)) + f32(h["eps"])
            params[n] = q + (f32(-(h["lr"] / (1 - b1 ** step))) * st["m"]) / denom
            continue
        beta = 1.0 - step ** -h["decay_rate"]
        s = g * g + f32(h["eps1"])
        if "R" in st:
            rows, cols = shape[0], math.prod(shape[1:])
            s2 = s.reshape(rows, cols)
            st["R"] = st["R"] * f32(beta) + s2.astype(f64).sum(axis=1).astype(f32) * f32(1 - beta)
            st["C"] = st["C"] * f32(beta) + s2.astype(f64).sum(axis=0).astype(f32) * f32(1 - beta)
            v = ((st["R"][:, None] * st["C"][None, :]) / f32(st["R"].astype(f64).sum())).ravel()
        else:
            st["V"] = st["V"] * f32(beta) + s * f32(1 - beta)
            v = st["V"]
        u = g / np.sqrt(v)
        rms_u = math.sqrt(float((u.astype(f64) ** 2).sum()) / u.size)
        rms_x = math.sqrt(float((x.astype(f64) ** 2).sum()) / x.size)
        alpha = max(h["eps2"], rms_x) * min(1e-2, 1 / math.sqrt(step)) if h["relative_step"] else h["lr"]
        update = f32(alpha / max(1.0, rms_u / h["clip_threshold"])) * u
        if h.get("beta1", 0.0) > 0:
            st["M"] = st.get("M", np.zeros(x.size, f32)) * f32(h["beta1"]) + f32(1 - h["beta1"]) * update
            update = st["M"]
        params[n] = x * f32(1 - alpha * h["weight_decay"]) - update
    after.append({n: listed(p) for n, p in params.items()})

doc = {
    "world_size": WORLD, "steps": STEPS, "max_grad_norm": 0.0,
    "params": [{"name": n, "shape": s, "group": g} for n, s, g in PARAMS],
    "groups": GROUPS,
    "pattern": "k = (i * 2654435761 + seed * 40503) % 2003 - 1001; float(k) / 1000 * scale",
    "initial_seed": "1 + index", "initial_scale": 0.2,
    "grad_seed": "100 * step + 10 * rank + index", "grad_scale": "0.3 + 0.2 * rank",
    "zero_grad": {"name": "emb", "elements": 16},
    "params_after_step": after,
    "state_after_last_step": {n: {k: listed(v) for k, v in st.items()} for n, st in state.items()
                              if GROUPS[dict((p[0], p[2]) for p in PARAMS)[n]]["kind"] == "adafactor"},
}
with open(OUT, "w") as f:
    json.dump(doc, f, separators=(",", ":"))
    f.write("\n")
print(f"wrote {OUT}")
