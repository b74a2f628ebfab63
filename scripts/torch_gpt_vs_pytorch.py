#!/usr/bin/env python3
"""The LibTorch GPT of examples/libtorch/torch_gpt.h (its head tied to the token embedding) in PyTorch
(Debian's python3-torch), trained data-parallel on the same ranks, threads and batches for
scripts/torch_gpt_vs_pytorch.sh: DDP over Gloo with torch.optim.AdamW (foreach=False), or DDP with
ZeroRedundancyOptimizer (AdamW state sharded, parameters broadcast after each step). Each layer is
built from seed + its index in the C++ order, so the initial values are the C++ run's (the first
loss shows it), and step s's batch comes from the same generator and seed as train_torch_gpt's.
Prints one line: the first loss, the median step time and the largest rank's peak RSS."""
import argparse
import math
import os
import resource
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        c = a.embd
        self.heads = a.heads
        self.ln1 = nn.LayerNorm(c)
        self.q, self.k, self.v, self.attn_proj = (nn.Linear(c, c) for _ in range(4))
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.heads
        h = self.ln1(x)
        split = lambda t: t.view(B, T, self.heads, hd).transpose(1, 2)
        q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
        att = q @ k.transpose(-2, -1) / math.sqrt(hd)
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + self.attn_proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x))))


class Embedding(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.wte = nn.Embedding(a.vocab, a.embd)
        self.wpe = nn.Embedding(a.block_size, a.embd)

    def forward(self, idx):
        return self.wte(idx) + self.wpe(torch.arange(idx.shape[1])).unsqueeze(0)


class Head(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.ln_f = nn.LayerNorm(a.embd)
        self.lm_head = nn.Linear(a.embd, a.vocab, bias=False)

    def forward(self, x):
        return self.lm_head(self.ln_f(x))


def make_model(a):
    def layer(l):
        torch.manual_seed(a.seed + l)
        return Embedding(a) if l == 0 else Head(a) if l == a.layers + 1 else Block(a)

    model = nn.Sequential(*[layer(l) for l in range(a.layers + 2)])
    model[a.layers + 1].lm_head.weight = model[0].wte.weight
    return model


def batch(a, step):
    g = torch.Generator().manual_seed(a.seed * 1000003 + step)
    tokens = torch.randint(a.vocab, (a.batch, a.block_size), generator=g)
    return tokens, (tokens * 5 + 1) % a.vocab


def worker(rank, a):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
    dist.init_process_group("gloo", rank=rank, world_size=a.nproc)
    model = nn.parallel.DistributedDataParallel(make_model(a))
    hyper = dict(lr=a.lr, weight_decay=a.weight_decay)
    if a.optimizer == "zero":
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, foreach=False, **hyper)
    else:
        opt = torch.optim.AdamW(model.parameters(), foreach=False, **hyper)
    local = a.batch // a.nproc
    steps, first_loss = [], None
    for step in range(a.steps):
        x, y = batch(a, step)
        x, y = x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]
        dist.barrier()
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x).reshape(-1, a.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        dist.barrier()
        steps.append(1e3 * (time.perf_counter() - t0))
        if first_loss is None:
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            first_loss = mean.item() / a.nproc
    peak = torch.tensor([float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024])
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if rank == 0:
        name = "DDP + ZeroRedundancyOptimizer" if a.optimizer == "zero" else "DDP"
        n = sum(p.numel() for p in model.parameters())
        print(f"pytorch {torch.__version__} {name}: {n} parameters, first loss {first_loss:.6f}, "
              f"median step {statistics.median(steps[1:]):.2f} ms, peak rss {peak.item() / 2**20:.1f} MiB", flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    for name, default in [("nproc", 4), ("steps", 20), ("batch", 16), ("vocab", 512), ("block_size", 64),
                          ("layers", 4), ("heads", 8), ("embd", 256), ("seed", 1), ("port", 29541)]:
        p.add_argument("--" + name.replace("_", "-"), type=int, default=default)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--optimizer", choices=["adamw", "zero"], default="adamw")
    a = p.parse_args()
    mp.spawn(worker, args=(a,), nprocs=a.nproc)


if __name__ == "__main__":
    main()
