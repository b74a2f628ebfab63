"""The optimizers the PyTorch references train with (scripts/gpt_optimizer_reference.py,
scripts/mlp_optimizer_reference.py, scripts/muon_reference.py), written from the published
algorithms in float32 on the CPU (Debian's python3-torch), not from the library.

Muon (Moonlight, arXiv 2502.16982), per matrix W (rows = shape[0], cols = the rest):
  m = momentum m + g;  u = nesterov ? g + momentum m : m
  W = W (1 - lr wd) - lr rms_scale sqrt(max(rows, cols)) newton_schulz(u)
  newton_schulz: X = G / (||G||_F + 1e-7), transposed when rows > cols; five times
  A = X X^T;  X = a X + (b A + c A A) X  with (a, b, c) = (3.4445, -4.7750, 2.0315)
Adafactor (Shazeer and Stern, ICML 2018; Hugging Face's first moment where beta1 > 0), per tensor X
(a matrix: shape[0] x the rest; else a vector), step t, S = G^2 + eps1, sums in float64:
  b = 1 - t^-decay_rate;  matrix: R = b R + (1 - b) S 1, C = b C + (1 - b) 1^T S, V = R C / (1^T R)
  vector: V = b V + (1 - b) S;  U = G / sqrt(V);  U = U / max(1, RMS(U) / clip_threshold)
  alpha = relative_step ? max(eps2, RMS(X)) min(1e-2, 1/sqrt(t)) : lr
  beta1 = 0: X = X (1 - alpha wd) - alpha U;  beta1 > 0: M = beta1 M + (1 - beta1) alpha U, X = X (1 - alpha wd) - M
AdamW: torch.optim.AdamW.

train_data_parallel: the references' data-parallel step (each rank's loss, the gradients averaged over
the ranks and clipped to a global norm, then the optimizer's step).
"""
import math

import numpy
import torch

A, B, C = 3.4445, -4.7750, 2.0315


def listed(t):
    """Each float32 as its shortest round-trip decimal (a JSON number that parses back to the same bits)."""
    return [float(numpy.format_float_positional(x, unique=True, trim="-")) for x in t.detach().flatten().numpy()]


def bf16(t):
    """Rounded to bfloat16 (to nearest even), held in float32."""
    return t.bfloat16().float()


def newton_schulz(g, steps=5, eps=1e-7):
    x = g.clone()
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / (x.norm() + eps)
    for _ in range(steps):
        a = x @ x.T
        x = A * x + (B * a + C * (a @ a)) @ x
    return x.T if tall else x


def newton_schulz_bf16(g, steps=5, eps=1e-7):
    """As a GPU's bf16 matrix units run it: every operation's result rounded to bfloat16, the products
    summed in float32. (Debian's CPU build of torch sums a bfloat16 matmul in bfloat16 itself, term by
    term, unlike a GPU's; so the rounding is spelled out here over float32 products.)"""
    x = bf16(g)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = bf16(x / bf16(bf16(x.norm()) + eps))
    for _ in range(steps):
        a = bf16(x @ x.T)
        b = bf16(bf16(B * a) + bf16(C * bf16(a @ a)))
        x = bf16(bf16(A * x) + bf16(b @ x))
    return x.T if tall else x


class Hybrid:
    """Each group's rule (its "kind": muon, adafactor or adamw) on the parameters it names."""

    def __init__(self, params, names_by_group, groups):
        self.params, self.groups, self.t = params, groups, 0
        self.group_of = {n: k for k, names in enumerate(names_by_group) for n in names}
        self.adamw = None
        adamw = [k for k, h in enumerate(groups) if h["kind"] == "adamw" and names_by_group[k]]
        if adamw:
            self.adamw = torch.optim.AdamW(
                [{"params": [params[n] for n in names_by_group[k]], "lr": groups[k]["lr"],
                  "weight_decay": groups[k]["weight_decay"], "betas": tuple(groups[k]["betas"]),
                  "eps": groups[k]["eps"]} for k in adamw])
        self.state = {}
        for n, k in self.group_of.items():
            p, h = params[n], groups[k]
            if h["kind"] == "muon":
                self.state[n] = {"m": torch.zeros_like(p)}
            elif h["kind"] == "adafactor":
                st = {"R": torch.zeros(p.shape[0]), "C": torch.zeros(math.prod(p.shape[1:]))} if p.dim() >= 2 \
                    else {"V": torch.zeros_like(p)}
                if h.get("beta1", 0.0) > 0:
                    st["M"] = torch.zeros_like(p)
                self.state[n] = st

    @torch.no_grad()
    def step(self):
        self.t += 1
        for n, st in self.state.items():
            h, p = self.groups[self.group_of[n]], self.params[n]
            if h["kind"] == "muon":
                self.muon(p, p.grad, st["m"], h)
            else:
                self.adafactor(p, p.grad, st, h)
        if self.adamw is not None:
            self.adamw.step()

    @staticmethod
    def muon(p, g, m, h):
        m.mul_(h["momentum"]).add_(g)
        u = g.add(m, alpha=h["momentum"]) if h["nesterov"] else m
        rows, cols = p.shape[0], math.prod(p.shape[1:])
        o = newton_schulz(u.reshape(rows, cols)).reshape(p.shape)
        p.mul_(1 - h["lr"] * h["weight_decay"])
        p.add_(o, alpha=-h["lr"] * h.get("rms_scale", 0.2) * math.sqrt(max(rows, cols)))

    def adafactor(self, p, g, st, h):
        beta = 1.0 - self.t ** -h["decay_rate"]
        s = g * g + h["eps1"]
        if "R" in st:
            s2 = s.reshape(p.shape[0], -1).double()
            st["R"] = st["R"] * beta + s2.sum(dim=1).float() * (1 - beta)
            st["C"] = st["C"] * beta + s2.sum(dim=0).float() * (1 - beta)
            v = ((st["R"][:, None] * st["C"][None, :]) / st["R"].double().sum().float()).reshape(p.shape)
        else:
            st["V"] = st["V"] * beta + s * (1 - beta)
            v = st["V"]
        u = g / v.sqrt()
        rms_u = math.sqrt(float((u.double() ** 2).sum()) / u.numel())
        rms_x = math.sqrt(float((p.double() ** 2).sum()) / p.numel())
        alpha = max(h["eps2"], rms_x) * min(1e-2, 1 / math.sqrt(self.t)) if h["relative_step"] else h["lr"]
        update = u * (alpha / max(1.0, rms_u / h["clip_threshold"]))
        if "M" in st:
            st["M"] = st["M"] * h["beta1"] + update * (1 - h["beta1"])
            update = st["M"]
        p.mul_(1 - alpha * h["weight_decay"])
        p.sub_(update)


def train_data_parallel(params, opt, rank_losses, steps, max_norm):
    """`steps` steps of `opt` on `params` (name -> leaf tensor); rank_losses(step) gives each rank's loss
    at the current parameters. Returns each step's per-rank losses, gradient norm before clipping
    (torch.nn.utils.clip_grad_norm_) and parameters after the step (listed)."""
    names = list(params)
    losses, norms, after = [], [], []
    for step in range(steps):
        grads = {n: torch.zeros_like(params[n]) for n in names}
        step_losses = []
        for loss in rank_losses(step):
            step_losses.append(float(loss))
            for n, g in zip(names, torch.autograd.grad(loss, [params[n] for n in names])):
                grads[n] += g
        losses.append(step_losses)
        for n in names:
            params[n].grad = grads[n] / len(step_losses)
        norms.append(float(torch.nn.utils.clip_grad_norm_([params[n] for n in names], max_norm)))
        opt.step()
        after.append({n: listed(params[n]) for n in names})
    return losses, norms, after
