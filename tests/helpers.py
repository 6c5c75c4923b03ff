"""Random inputs for the harness's own unit tests."""
from __future__ import annotations

import torch


def random_inputs(B=2, S=5, G=2, h=3, Dk=8, Dv=6, S_kv=23, n=4, dtype=torch.float64, seed=0,
                  lo=-3, hi=None, requires_grad=False):
    """q, k, v and raw ranges with overlaps, padding and out-of-bounds ends."""
    g = torch.Generator().manual_seed(seed)
    hi = S_kv + 4 if hi is None else hi
    q = torch.randn(B, S, G, h, Dk, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(B, G, S_kv, Dk, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(B, G, S_kv, Dv, generator=g, dtype=torch.float64).to(dtype)
    ranges = torch.randint(lo, hi, (B, S, G, n, 2), generator=g)
    for t in (q, k, v):
        t.requires_grad_(requires_grad)
    return q, k, v, ranges
