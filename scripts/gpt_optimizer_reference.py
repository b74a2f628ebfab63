#!/usr/bin/python3
# References for the GPT example trained with Muon + AdamW and with Adafactor, computed with PyTorch
# (Debian's python3-torch, float32 on the CPU, one process) from the published algorithms, not from
# the library: tests/gpt_reference_worker.cc trains the example's GPT by the engine at any layout
# and compares with them (tests/gpt_reference_test.cc). Writes, next to the AdamW reference it starts
# from (its model, initial values and tokens):
#
#   tests/data/pytorch/gpt/gpt_4layer_dp2_muon.json
#   tests/data/pytorch/gpt/gpt_4layer_dp2_adafactor.json
#
#   /usr/bin/python3 scripts/gpt_optimizer_reference.py
#
# The optimizers: scripts/reference_optimizers.py. Training, per step: each of the 2 data-parallel ranks takes the loss of its own batch (the AdamW
# reference's tokens, its 3 steps' batches used again in order for steps 4 and 5), the gradients
# are averaged over the ranks and clipped to a global norm of 1 (torch.nn.utils.clip_grad_norm_),
# then the optimizer steps.
#
# Muon + AdamW (Moonlight, arXiv 2502.16982): the blocks' weight matrices ("h.*", 2-D) in Muon,
#   m = 0.95 m + g;  O = newton_schulz(m);  W = W (1 - lr wd) - lr 0.2 sqrt(max(rows, cols)) O
#   newton_schulz: X = G / (||G||_F + 1e-7), transposed when rows > cols; five times
#   A = X X^T;  X = a X + (b A + c A A) X  with (a, b, c) = (3.4445, -4.7750, 2.0315)
# the embeddings (decayed) and the vectors (not) in torch.optim.AdamW.
# Adafactor (Shazeer and Stern, ICML 2018, without a first moment), every tensor: per tensor X (a
# matrix: shape[0] x the rest; else a vector), step t, S = G^2 + eps1:
#   b = 1 - t^-0.8;  matrix: R = b R + (1 - b) S 1, C = b C + (1 - b) 1^T S, V = R C / (1^T R)
#   vector: V = b V + (1 - b) S;  U = G / sqrt(V);  U = U / max(1, RMS(U) / d)
#   alpha = relative_step ? max(eps2, RMS(X)) min(1e-2, 1/sqrt(t)) : lr;  X = X (1 - alpha wd) - alpha U
# with the matrices and embeddings decayed (group 0, lr 0.01, wd 0.1), the norms' gains and biases at
# the relative step (group 1), and the linear layers' biases in torch.optim.AdamW (group 2; why: at
# recipes()).
import json
import math
import os

import torch
import torch.nn.functional as F

from reference_optimizers import Hybrid, train_data_parallel

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "pytorch", "gpt")
BASE = "gpt_4layer_dp2"
STEPS, MAX_NORM = 5, 1.0


def layer_norm(x, p, name):
    return F.layer_norm(x, (x.shape[-1],), p[name + ".weight"], p[name + ".bias"], 1e-5)


def linear(x, p, name):
    return x @ p[name + ".weight"].t() + p[name + ".bias"]


def gpt_loss(p, cfg, rows):
    # The model of the reference file's "model" field.
    tokens = torch.tensor(rows, dtype=torch.long)
    idx, targets = tokens[:, :-1], tokens[:, 1:]
    Bn, T = idx.shape
    Cn, H = cfg["n_embd"], cfg["n_head"]
    x = p["wte.weight"][idx] + p["wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    for i in range(cfg["n_layer"]):
        h = f"h.{i}."
        q, k, v = linear(layer_norm(x, p, h + "ln_1"), p, h + "attn.c_attn").split(Cn, dim=2)
        q, k, v = (t.view(Bn, T, H, Cn // H).transpose(1, 2) for t in (q, k, v))
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(Cn // H)).masked_fill(mask, float("-inf")).softmax(-1)
        x = x + linear((att @ v).transpose(1, 2).reshape(Bn, T, Cn), p, h + "attn.c_proj")
        x = x + linear(F.gelu(linear(layer_norm(x, p, h + "ln_2"), p, h + "mlp.c_fc"), approximate="tanh"), p,
                       h + "mlp.c_proj")
    logits = layer_norm(x, p, "ln_f") @ p["wte.weight"].t()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


ADAFACTOR = {"kind": "adafactor", "eps1": 1e-30, "eps2": 1e-3, "clip_threshold": 1.0, "decay_rate": 0.8}
ADAMW = {"kind": "adamw", "betas": [0.9, 0.95], "eps": 1e-8}


def recipes(names):
    decayed = [n for n in names if n in ("wte.weight", "wpe.weight")]
    hidden = [n for n in names if n.startswith("h.") and n.endswith(".weight") and "ln_" not in n]
    vectors = [n for n in names if n not in decayed and n not in hidden]
    norms = [n for n in vectors if ".ln_" in n or n.startswith("ln_f.")]
    biases = [n for n in vectors if n not in norms]
    return {
        # Groups as the example registers them (examples/optimizer_groups.h): 0 decayed, 1 not, 2 Muon.
        "muon": ([decayed, vectors, hidden],
                 [dict(ADAMW, lr=0.01, weight_decay=0.1), dict(ADAMW, lr=0.01, weight_decay=0.0),
                  {"kind": "muon", "lr": 0.01, "weight_decay": 0.1, "momentum": 0.95, "nesterov": False,
                   "rms_scale": 0.2}], Hybrid),
        # The linear layers' biases in AdamW: the key bias's gradient is zero but for rounding (softmax
        # ignores a constant added to a row's scores), and Adafactor's unfactored update G / sqrt(V)
        # turns that rounding into steps of the learning rate's size, which no two implementations share.
        "adafactor": ([decayed + hidden, norms, biases],
                      [dict(ADAFACTOR, lr=0.01, weight_decay=0.1, relative_step=False),
                       dict(ADAFACTOR, lr=0.01, weight_decay=0.0, relative_step=True),
                       dict(ADAMW, lr=0.01, weight_decay=0.0)], Hybrid),
    }


def main():
    with open(os.path.join(HERE, BASE + ".json")) as f:
        base = json.load(f)
    cfg, train = base["config"], base["train"]
    names = [p["name"] for p in base["params"]]
    shapes = {p["name"]: p["shape"] for p in base["params"]}
    world = train["world_size"]
    batches = train["tokens_per_step_per_rank"]
    for label, (names_by_group, groups, optimizer) in recipes(names).items():
        params = {n: torch.tensor(base["initial_params"][n], dtype=torch.float32).reshape(shapes[n]).requires_grad_()
                  for n in names}
        opt = optimizer(params, names_by_group, groups)
        tokens = [batches[step % len(batches)] for step in range(STEPS)]
        losses, norms, after = train_data_parallel(
            params, opt, lambda step: (gpt_loss(params, cfg, rows) for rows in tokens[step]), STEPS, MAX_NORM)
        # The model is the AdamW reference's: its first step's losses are the same.
        want = train["loss_per_step_per_rank"][0]
        assert all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(losses[0], want)), (losses[0], want)
        doc = dict(base)
        doc["name"] = f"{BASE}_{label}"
        doc["torch_version"] = torch.__version__
        doc["train"] = {
            "world_size": world, "batch_per_rank": train["batch_per_rank"], "steps": STEPS, "optimizer": label,
            "max_grad_norm": MAX_NORM,
            "param_groups": [{"names": ns, **h} for ns, h in zip(names_by_group, groups)],
            "tokens_per_step_per_rank": tokens, "loss_per_step_per_rank": losses,
            "grad_norm_before_clip": norms, "params_after_step": after,
        }
        out = os.path.join(HERE, f"{BASE}_{label}.json")
        with open(out, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.write("\n")
        print(f"wrote {os.path.normpath(out)}: losses {[round(sum(l) / world, 4) for l in losses]}")


if __name__ == "__main__":
    main()
