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
# ranks and clipped to a global norm of 1 (torch.nn.utils.clip_grad_norm_), then the optimizer steps
# (scripts/reference_optimizers.py).
# Muon + AdamW: every weight in Muon (m = 0.95 m + g; W = W (1 - lr wd) - lr 0.2 sqrt(max(rows,
# cols)) newton_schulz(m); rows = fan_in, as the MLP stores W [fan_in, fan_out]), the biases in
# torch.optim.AdamW. Adafactor (the paper's, with Hugging Face's first moment where beta1 > 0): the
# weights factored, lr 0.01, weight decay 0.1, beta1 0.9; the biases unfactored at the relative step.
import json
import math
import os

import torch
import torch.nn.functional as F

from reference_optimizers import Hybrid, listed, train_data_parallel

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "testdata",
                   "mlp_optimizer_reference.json")
WIDTHS = [16, 32, 32, 8]
WORLD, BATCH, STEPS, MAX_NORM = 6, 4, 5, 1.0


def mlp_loss(p, x, labels):
    h = x
    layers = len(WIDTHS) - 1
    for l in range(layers):
        h = h @ p[f"layer{l}.weight"] + p[f"layer{l}.bias"]
        if l + 1 < layers:
            h = h.clamp(min=0)
    return F.cross_entropy(h, labels)


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
                   "rms_scale": 0.2}, dict(ADAMW, lr=0.01, weight_decay=0.0)], Hybrid),
        "adafactor": ([weights, biases],
                      [dict(ADAFACTOR, lr=0.01, weight_decay=0.1, relative_step=False, beta1=0.9),
                       dict(ADAFACTOR, lr=0.01, weight_decay=0.0, relative_step=True, beta1=0.0)], Hybrid),
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
        losses, norms, after = train_data_parallel(
            params, opt, lambda step: (mlp_loss(params, x, y) for x, y in batches[step]), STEPS, MAX_NORM)
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
