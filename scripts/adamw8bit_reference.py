#!/usr/bin/python3
# The 8-bit AdamW reference for optim/adamw8bit_test.cc and zero/adamw8bit_engine_test.cc, written
# from the published algorithm (Dettmers et al., arXiv 2110.02861: block-wise dynamic quantization of
# both Adam moments) in numpy float32, not from the library. Writes optim/testdata/adamw8bit_reference.json:
#
#   /usr/bin/python3 scripts/adamw8bit_reference.py [OUT]      (Debian: python3-numpy)
#
# The map: bitsandbytes' create_dynamic_map (7 exponent bits), its linspace and means in double,
# rounded to float32 once. Quantization of a block x (256 elements of a tensor, counted from its first
# element; the last block may be shorter):
#   absmax = max |x|;  q = x / absmax (q = x / 1 where absmax is 0)
#   code = the number of midpoints (map[k] + map[k+1]) * 0.5 below q;  value = map[code] * absmax
# exp_avg with the signed map, exp_avg_sq with the unsigned one. Per step and tensor of at least 4096
# elements, with g the gradient averaged over two ranks:
#   m, v = dequantized;  torch.optim.AdamW's update in float32, as PyTorch 1.13 computes it
#   (p *= 1 - lr wd;  m = fma(g, 1 - b1, m b1);  v = fma((1 - b2) g, g, v b2);
#    p += (-lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps));  m, v quantized again.
# Smaller tensors, and the plain AdamW group, keep fp32 moments (the same update without quantizing).
# fma(a, b, c) is computed in float64 (the product is exact there) and rounded to float32.
# The initial parameters and the gradients come from a formula (pattern() below, which the test
# restates), so the file holds only the results: the parameters after steps 3 and 5 and the state
# (codes and absmax) after step 5.
import json
import math
import sys

import numpy as np

OUT = sys.argv[1] if len(sys.argv) > 1 else "optim/testdata/adamw8bit_reference.json"
BLOCK, MIN_NUMEL, WORLD, STEPS = 256, 4096, 2, 5
rng = np.random.default_rng(20261206)
f32 = np.float32


def listed(a):
    # Each float32 as its shortest round-trip decimal (a JSON number that parses back to the same bits).
    return [float(np.format_float_positional(x, unique=True, trim="-")) for x in np.asarray(a, f32).ravel()]


def dynamic_map(signed):
    scale = [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0]
    values = []
    for i in range(7):
        n = 2 ** i if signed else 2 ** (i + 1)
        for k in range(n):
            lo, hi = 0.1 + (1.0 - 0.1) * k / n, 0.1 + (1.0 - 0.1) * (k + 1) / n
            mean = (lo + hi) / 2.0
            values.append(scale[i] * mean)
            if signed:
                values.append(-(scale[i] * mean))
    values += [0.0, 1.0]
    values = np.array(sorted(values), dtype=f32)
    assert values.size == 256
    return values, (values[:-1] + values[1:]) * f32(0.5)


MAPS = {True: dynamic_map(True), False: dynamic_map(False)}


def quantize(x, signed):
    values, mids = MAPS[signed]
    absmax = np.max(np.abs(x)) if x.size else f32(0)
    q = x / (absmax if absmax > 0 else f32(1))
    return f32(absmax), np.searchsorted(mids, q, side="left").astype(np.uint8)


def dequantize(codes, absmax, signed):
    return MAPS[signed][0][codes] * f32(absmax)


def fma(a, b, c):
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(f32)


cases = []
ties = {s: np.concatenate([[f32(1.0)], MAPS[s][1]]).astype(f32) for s in (True, False)}
for signed, x in [(True, rng.standard_normal(256).astype(f32)),
                  (True, np.concatenate([rng.standard_normal(255), [-9.0]]).astype(f32)),  # a negative absmax
                  (True, (rng.standard_normal(100) * 1e-3).astype(f32)),                    # a short last block
                  (True, np.zeros(256, f32)),
                  (True, (rng.standard_normal(256) ** 9).astype(f32)),                     # every decade
                  (True, ties[True]),                                                      # q on the midpoints
                  (False, (rng.standard_normal(256) ** 2).astype(f32)),
                  (False, (np.abs(rng.standard_normal(256)) ** 12).astype(f32)),
                  (False, ties[False])]:
    absmax, codes = quantize(x, signed)
    cases.append({"signed": signed, "input": listed(x), "absmax": listed([absmax])[0], "codes": codes.tolist()})

# name, shape, group. Groups 0 and 1 run 8-bit AdamW (their tensors under 4096 elements keep fp32
# moments), group 2 plain AdamW. emb's first block (rows 0-3) never gets a gradient: an all-zero block.
PARAMS = [("emb", [72, 64], 0), ("h0.w", [64, 72], 0), ("h0.b", [72], 1), ("h1.w", [68, 70], 1),
          ("conv.w", [16, 8, 36], 0), ("h2.w", [30, 40], 0), ("ln.g", [64], 2)]
GROUPS = [{"kind": "adamw8bit", "lr": 0.01, "weight_decay": 0.1, "betas": [0.9, 0.95], "eps": 1e-8},
          {"kind": "adamw8bit", "lr": 0.02, "weight_decay": 0.0, "betas": [0.9, 0.999], "eps": 1e-8},
          {"kind": "adamw", "lr": 0.01, "weight_decay": 0.01, "betas": [0.9, 0.95], "eps": 1e-8}]

def pattern(seed, n, scale):
    # Multiples of 1/1000 in [-1, 1], times scale, in float32: the same bits in any language.
    i = np.arange(n, dtype=np.int64)
    k = (i * 2654435761 + seed * 40503) % 2003 - 1001
    return k.astype(f32) / f32(1000) * f32(scale)


params = {n: pattern(1 + t, math.prod(s), 0.2) for t, (n, s, _) in enumerate(PARAMS)}
quantized = {n: GROUPS[g]["kind"] == "adamw8bit" and math.prod(s) >= MIN_NUMEL for n, s, g in PARAMS}
state = {n: {"m": np.zeros_like(p), "v": np.zeros_like(p)} for n, p in params.items()}
for n in params:
    if quantized[n]:
        blocks = (params[n].size + BLOCK - 1) // BLOCK
        state[n] = {"mc": np.zeros(params[n].size, np.uint8), "ma": np.zeros(blocks, f32),
                    "vc": np.zeros(params[n].size, np.uint8), "va": np.zeros(blocks, f32)}

after = []
for step in range(1, STEPS + 1):
    per_rank = [{n: pattern(100 * step + 10 * r + t, math.prod(s), 0.3 + 0.2 * r) for t, (n, s, _) in enumerate(PARAMS)}
                for r in range(WORLD)]
    for rank in per_rank:
        rank["emb"][:BLOCK] = 0
    for n, _, k in PARAMS:
        h = GROUPS[k]
        b1, b2 = h["betas"]
        g = (per_rank[0][n] + per_rank[1][n]) / f32(2)
        p, st = params[n], state[n]
        blocks = [slice(a, min(a + BLOCK, p.size)) for a in range(0, p.size, BLOCK)] if quantized[n] else [slice(0, p.size)]
        for b, sl in enumerate(blocks):
            if quantized[n]:
                m = dequantize(st["mc"][sl], st["ma"][b], True)
                v = dequantize(st["vc"][sl], st["va"][b], False)
            else:
                m, v = st["m"][sl], st["v"][sl]
            q = p[sl] * f32(1 - h["lr"] * h["weight_decay"])
            m = fma(g[sl], f32(1 - b1), m * f32(b1))
            v = fma(f32(1 - b2) * g[sl], g[sl], v * f32(b2))
            denom = np.sqrt(v) / f32(math.sqrt(1 - b2 ** step)) + f32(h["eps"])
            p[sl] = q + (f32(-(h["lr"] / (1 - b1 ** step))) * m) / denom
            if quantized[n]:
                st["ma"][b], st["mc"][sl] = quantize(m, True)
                st["va"][b], st["vc"][sl] = quantize(v, False)
            else:
                st["m"][sl], st["v"][sl] = m, v
    if step in (3, 5):
        after.append({n: listed(p) for n, p in params.items()})


def final_state(n):
    st = state[n]
    return {"exp_avg_codes": st["mc"].tolist(), "exp_avg_absmax": listed(st["ma"]),
            "exp_avg_sq_codes": st["vc"].tolist(), "exp_avg_sq_absmax": listed(st["va"])}


doc = {
    "map": {"signed": listed(MAPS[True][0]), "unsigned": listed(MAPS[False][0])},
    "quantize_cases": cases,
    "training": {
        "block": BLOCK, "min_numel": MIN_NUMEL, "world_size": WORLD, "steps": STEPS, "max_grad_norm": 0.0,
        "params": [{"name": n, "shape": s, "group": g} for n, s, g in PARAMS],
        "groups": GROUPS,
        "pattern": "k = (i * 2654435761 + seed * 40503) % 2003 - 1001; float(k) / 1000 * scale",
        "initial_seed": "1 + index", "initial_scale": 0.2,
        "grad_seed": "100 * step + 10 * rank + index", "grad_scale": "0.3 + 0.2 * rank",
        "zero_grad": {"name": "emb", "elements": BLOCK},
        "params_after_step": {"3": after[0], "5": after[1]},
        "state_after_step_5": {n: final_state(n) for n in params if quantized[n]},
    },
}
with open(OUT, "w") as f:
    json.dump(doc, f, separators=(",", ":"))
    f.write("\n")
print(f"wrote {OUT}")
