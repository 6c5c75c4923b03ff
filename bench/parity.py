"""Parity of a benchmarked method against the fp64 golden reference, on sampled rows.

A speedup only counts when the result is right, so each method runs once more on the
first input set with every key that no row selected set to NaN (a read outside the
selection then shows up as NaN) and, on a GPU, with the allocator's free memory set to NaN
(an output element never written shows up as NaN), and its output on up to `rows` sampled rows is compared
with the fp64 gather reference under SPEC.md's tolerances: fp32 max <= 1e-5 and mean
<= 1e-6; fp16/bf16 max <= 2x a plain PyTorch run in that precision plus
`2 * eps * max|ref|`, mean <= 1e-3; NaN where the reference is finite always fails.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from selgate.reference import selected_keys
from selgate.reference.golden import gather_attention

from .inputs import Inputs


@dataclass(frozen=True)
class Parity:
    ok: bool
    max_err: float
    bound: float

    def label(self) -> str:
        return "ok" if self.ok else f"FAIL max_err={self.max_err:.3g} > {self.bound:.3g}"


def poisoned(x: Inputs) -> Inputs:
    """Copy of `x` whose unselected keys and values are NaN."""
    keep = selected_keys(x.ranges, x.k.shape[2])[..., None]
    nan = float("nan")
    return Inputs(x.q, x.k.masked_fill(~keep, nan), x.v.masked_fill(~keep, nan), x.ranges, x.scale)


def _sample(n: int, count: int, device) -> torch.Tensor:
    return torch.linspace(0, n - 1, min(n, count), device=device).round().long().unique()


def check_parity(o: torch.Tensor, x: Inputs, *, rows: int = 64) -> Parity:
    """Compare `o` [B, S, G, h, Dv] with the fp64 reference on sampled (b, s) rows of `x`."""
    B, S = x.q.shape[:2]
    bi = _sample(B, max(rows // min(S, rows), 1), x.q.device)
    si = _sample(S, rows, x.q.device)
    q = x.q[bi][:, si]
    r = x.ranges[bi][:, si]
    k, v = x.k[bi], x.v[bi]
    ref, _ = gather_attention(q, k, v, r, scale=x.scale)
    got = o[bi][:, si].double()
    err = (got - ref).abs()
    if not torch.isfinite(got).all():
        return Parity(False, float("nan"), 0.0)
    max_err, mean_err = float(err.max()), float(err.mean())
    if x.q.dtype in (torch.float16, torch.bfloat16):
        plain, _ = gather_attention(q, k, v, r, scale=x.scale, dtype=x.q.dtype)
        floor = 2 * torch.finfo(x.q.dtype).eps * float(ref.abs().max())
        bound = 2 * float((plain.double() - ref).abs().max()) + floor
        return Parity(max_err <= bound and mean_err <= 1e-3, max_err, bound)
    bound, mean_bound = (1e-5, 1e-6) if x.q.dtype == torch.float32 else (1e-10, 1e-12)
    return Parity(max_err <= bound and mean_err <= mean_bound, max_err, bound)
