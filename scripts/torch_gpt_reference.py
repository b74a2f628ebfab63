#!/usr/bin/python3
# The reference for the LibTorch GPT (examples/libtorch/torch_gpt.h) trained through TorchPipeline at
# any (dp, tp, pp) layout: the same model in Python PyTorch (Debian's python3-torch, float32 on the
# CPU, one process, the whole batch), written from nanoGPT's structure, not from the library.
# examples/libtorch/torch_gpt_test.cc loads the initial values and batches from the file it writes,
# trains at each layout and compares the losses and the final parameters:
#
#   /usr/bin/python3 scripts/torch_gpt_reference.py    # writes tests/data/pytorch/libtorch/torch_gpt.json
#
# The model (the C++ one's names): layer 0 "0.wte.weight" [V, C] and "0.wpe.weight" [T, C]; blocks
# l = 1..n: x + attn_proj(attention(q, k, v of ln1(x))), then x + mlp_proj(gelu(fc(ln2(x)))), causal,
# n_head heads; layer n+1: lm_head(ln_f(x)), no bias, its weight wte's (tied: listed once, as
# "0.wte.weight"). The loss is the mean cross-entropy of the whole batch. Training, per step: the
# loss, backward, clip_grad_norm_(1.0), torch.optim.AdamW (lr 3e-3, weight decay 0.01 on every
# tensor, betas and eps PyTorch's defaults).
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, BLOCK, N_LAYER, N_HEAD, N_EMBD = 64, 8, 2, 4, 32
BATCH, STEPS, SEED = 8, 4, 7
LR, WD, CLIP = 3e-3, 0.01, 1.0


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(N_EMBD)
        self.q = nn.Linear(N_EMBD, N_EMBD)
        self.k = nn.Linear(N_EMBD, N_EMBD)
        self.v = nn.Linear(N_EMBD, N_EMBD)
        self.attn_proj = nn.Linear(N_EMBD, N_EMBD)
        self.ln2 = nn.LayerNorm(N_EMBD)
        self.fc = nn.Linear(N_EMBD, 4 * N_EMBD)
        self.mlp_proj = nn.Linear(4 * N_EMBD, N_EMBD)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // N_HEAD
        h = self.ln1(x)
        split = lambda t: t.view(B, T, N_HEAD, hd).transpose(1, 2)
        q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
        att = q @ k.transpose(-2, -1) / math.sqrt(hd)
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x))))


class Embedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, N_EMBD)
        self.wpe = nn.Embedding(BLOCK, N_EMBD)

    def forward(self, idx):
        return self.wte(idx) + self.wpe(torch.arange(idx.shape[1])).unsqueeze(0)


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_f = nn.LayerNorm(N_EMBD)
        self.lm_head = nn.Linear(N_EMBD, VOCAB, bias=False)

    def forward(self, x):
        return self.lm_head(self.ln_f(x))


def layer(l):
    torch.manual_seed(SEED + l)
    if l == 0:
        return Embedding()
    if l == N_LAYER + 1:
        return Head()
    return Block()


def main():
    model = nn.Sequential(*[layer(l) for l in range(N_LAYER + 2)])
    model[N_LAYER + 1].lm_head.weight = model[0].wte.weight
    tokens = (torch.arange(BATCH * BLOCK).reshape(BATCH, BLOCK) * 7 + 3) % VOCAB
    targets = (tokens * 5 + 1) % VOCAB
    # 9 significant digits give a float32 back exactly, in half the text of a double's.
    flat = lambda t: [float("%.9g" % x) for x in t.detach().reshape(-1).tolist()]
    initial = {name: flat(p) for name, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(model(tokens).reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
    out = {
        "source": "scripts/torch_gpt_reference.py, PyTorch " + torch.__version__,
        "config": {"vocab": VOCAB, "block_size": BLOCK, "n_layer": N_LAYER, "n_head": N_HEAD, "n_embd": N_EMBD,
                   "batch": BATCH, "steps": STEPS, "lr": LR, "weight_decay": WD, "clip": CLIP},
        "shapes": {name: list(p.shape) for name, p in model.named_parameters()},
        "initial": initial,
        "losses": losses,
        "final": {name: flat(p) for name, p in model.named_parameters()},
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "pytorch", "libtorch",
                        "torch_gpt.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {os.path.normpath(path)}: losses {losses}")


if __name__ == "__main__":
    main()
