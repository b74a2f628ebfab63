#!/usr/bin/env python3
"""The GPT example's model in PyTorch (Debian's python3-torch), trained data-parallel on the same
number of ranks and threads as ours, for scripts/gpt_vs_pytorch.sh: DDP over Gloo, AdamW, clipping,
one thread per rank. Prints one line: median step time (ms) and tokens/s over the timed steps."""
import argparse
import math
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)
        self.h = h

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.h)
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab, block, c, h, layers):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(block, c)
        self.blocks = nn.ModuleList(Block(c, h) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def worker(rank, args):
    torch.set_num_threads(args.threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group("gloo", rank=rank, world_size=args.nproc)
    torch.manual_seed(1)
    model = nn.parallel.DistributedDataParallel(Gpt(256, args.block, args.n_embd, args.n_head, args.n_layer))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95))
    local = args.batch // args.nproc
    g = torch.Generator().manual_seed(rank)
    times = []
    for step in range(args.steps):
        tokens = torch.randint(0, 256, (local, args.block + 1), generator=g)
        dist.barrier()
        t0 = time.perf_counter()
        loss = model(tokens[:, :-1], tokens[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dist.barrier()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        t = statistics.median(times[1:])
        print(f"pytorch {torch.__version__} DDP: {n} parameters, step {1e3 * t:.1f} ms, "
              f"{args.batch * args.block / t:.0f} tokens/s")
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    for name, default in [("nproc", 2), ("threads", 1), ("steps", 6), ("batch", 8), ("block", 128),
                          ("n_embd", 384), ("n_head", 6), ("n_layer", 6), ("port", 29512)]:
        p.add_argument("--" + name.replace("_", "-"), type=int, default=default)
    args = p.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.nproc)


if __name__ == "__main__":
    main()
