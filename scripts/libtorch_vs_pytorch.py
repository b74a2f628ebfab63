#!/usr/bin/env python3
"""The LibTorch example's model (examples/libtorch/torch_mlp.h) in PyTorch (Debian's python3-torch),
trained data-parallel on the same ranks, threads, batches and seed, for scripts/libtorch_vs_pytorch.sh:
DDP over Gloo with torch.optim.AdamW (foreach=False), or DDP with ZeroRedundancyOptimizer (AdamW state
sharded across ranks, parameters broadcast after each step). Prints one line per run with the median
step time and its split, in the same form as train_torch's summary."""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer


class ResidualBlock(nn.Module):
    def __init__(self, hidden, ff):
        super().__init__()
        # Created in the order of the C++ module, so that the initial values are the same.
        self.ln = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ff)
        self.fc2 = nn.Linear(ff, hidden)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


def make_model(a):
    layers = [nn.Linear(a.inputs, a.hidden)]
    layers += [ResidualBlock(a.hidden, a.ff) for _ in range(a.blocks)]
    layers += [nn.LayerNorm(a.hidden), nn.Linear(a.hidden, a.classes)]
    return nn.Sequential(*layers)


def batch(a, step):
    teacher = torch.randn(a.inputs, a.classes, generator=torch.Generator().manual_seed(a.seed))
    x = torch.randn(a.batch, a.inputs, generator=torch.Generator().manual_seed(a.seed * 1000 + step + 1))
    return x, (x @ teacher).argmax(1)


def worker(rank, a):
    torch.set_num_threads(a.threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
    dist.init_process_group("gloo", rank=rank, world_size=a.nproc)
    torch.manual_seed(a.seed)
    model = nn.parallel.DistributedDataParallel(make_model(a), bucket_cap_mb=a.bucket_mb)
    hyper = dict(lr=a.lr, weight_decay=a.weight_decay)
    if a.optimizer == "zero":
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, foreach=False, **hyper)
    else:
        opt = torch.optim.AdamW(model.parameters(), foreach=False, **hyper)
    local = a.batch // a.nproc
    times = {"step": [], "fwd": [], "bwd": [], "rest": []}
    first_loss = None
    for step in range(a.steps):
        x, y = batch(a, step)
        x, y = x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]
        dist.barrier()
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP's all-reduce overlaps it; backward returns once the buckets are reduced
        t2 = time.perf_counter()
        opt.step()
        dist.barrier()
        t3 = time.perf_counter()
        for k, v in (("fwd", t1 - t0), ("bwd", t2 - t1), ("rest", t3 - t2), ("step", t3 - t0)):
            times[k].append(1e3 * v)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if first_loss is None:
            first_loss = mean.item() / a.nproc
    if rank == 0:
        med = {k: statistics.median(v[1:]) for k, v in times.items()}
        name = "ZeroRedundancyOptimizer" if a.optimizer == "zero" else "DDP"
        n = sum(p.numel() for p in model.parameters())
        print(f"pytorch {torch.__version__} {name}: {n} parameters, first loss {first_loss:.9e}, "
              f"median step {med['step']:.2f} ms (forward {med['fwd']:.2f}, backward {med['bwd']:.2f}, "
              f"outside forward/backward {med['rest']:.2f}) over {a.steps - 1} steps", flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    for name, default in [("nproc", 2), ("threads", 1), ("steps", 20), ("batch", 64), ("inputs", 256),
                          ("hidden", 512), ("ff", 2048), ("blocks", 4), ("classes", 16), ("seed", 1),
                          ("port", 29531), ("bucket_mb", 25)]:
        p.add_argument("--" + name.replace("_", "-"), type=int, default=default)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--optimizer", choices=["adamw", "zero"], default="adamw")
    a = p.parse_args()
    mp.spawn(worker, args=(a,), nprocs=a.nproc)


if __name__ == "__main__":
    main()
