"""Toy training check: a small model with one selection-attention layer, trained on the
Triton path (forward and backward kernels) under bf16 autocast. Its loss must stay finite
and decrease.

The task needs the selection: the target at every position is the sequence's first token,
which each query reaches only through block 0 (forced by the range builder).

    python -m selgate.bench.train_check --steps 300
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn

from selgate.kernels import selection_attention
from selgate.reference import build_ranges


class ToySelectionModel(nn.Module):
    """Embedding -> one grouped selection-attention layer (G groups x h heads) -> vocab logits."""

    def __init__(self, vocab: int, T: int, dim: int = 128, G: int = 2, h: int = 4, D: int = 32):
        super().__init__()
        self.G, self.h, self.D = G, h, D
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(T, dim)
        self.q = nn.Linear(dim, G * h * D)
        self.kv = nn.Linear(dim, 2 * G * D)
        self.proj = nn.Linear(G * h * D, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor, ranges: torch.Tensor, backend: str) -> torch.Tensor:
        B, T = x.shape
        e = self.tok(x) + self.pos(torch.arange(T, device=x.device))
        q = self.q(e).view(B, T, self.G, self.h, self.D)
        k, v = self.kv(e).view(B, T, 2, self.G, self.D).permute(2, 0, 3, 1, 4)
        o = selection_attention(q, k, v, ranges, backend=backend, strict=True)
        return self.head(e + self.proj(o.reshape(B, T, -1)))


def run(
    steps: int = 300,
    *,
    device: str = "cuda",
    dtype=torch.bfloat16,
    backend: str = "triton",
    B: int = 8,
    T: int = 256,
    vocab: int = 64,
    l_sel: int = 32,
    n: int = 4,
    seed: int = 0,
) -> list:
    """Train for `steps` steps under autocast(`dtype`); returns the loss of every step."""
    torch.manual_seed(seed)
    model = ToySelectionModel(vocab, T).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator(device=device).manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, vocab, (B, T), device=device, generator=g)
        scores = torch.rand(B, T, model.G, T // l_sel, device=device, generator=g)
        ranges = build_ranges(scores, G=model.G, l_sel=l_sel, n=n, S_kv=T)
        with torch.autocast(device, dtype=dtype):
            logits = model(x, ranges, backend)
        loss = nn.functional.cross_entropy(logits.float().reshape(-1, vocab), x[:, :1].expand(B, T).reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def verdict(losses: list, window: int = 20) -> tuple:
    """(ok, first-window mean, last-window mean): finite throughout and the mean loss of the
    last `window` steps below half that of the first."""
    first = sum(losses[:window]) / window
    last = sum(losses[-window:]) / window
    return all(math.isfinite(x) for x in losses) and last < 0.5 * first, first, last


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--backend", default="triton")
    args = ap.parse_args()
    losses = run(args.steps, backend=args.backend)
    ok, first, last = verdict(losses)
    print(
        f"bf16 autocast toy training, {args.steps} steps on {args.backend}: loss {first:.4f} -> {last:.4f} "
        f"(mean of first/last 20 steps), finite={all(map(math.isfinite, losses))}: {'PASS' if ok else 'FAIL'}"
    )
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
