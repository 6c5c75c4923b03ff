"""Family varlen: packed sequences (cu_seqlens) equal per-sequence calls."""

from __future__ import annotations

from dataclasses import replace

import torch

from selgate.reference import selected_keys

from ..cases import Case, make_inputs
from ..evaluation import compare, evaluate, golden_fn, guarding, plain_fn, reference_run
from ..family import VARLEN, Family
from ..inputs import Inputs
from ..impl import Impl


def _per_sequence(fn_of_ranges, inp: Inputs):
    """`(q, k, v) -> (o, lse)` running each packed sequence as its own batched call."""
    cu_q, cu_k = inp.cu_seqlens_q.tolist(), inp.cu_seqlens_k.tolist()

    def run(q, k, v):
        outs = [
            fn_of_ranges(inp.ranges[:, a:b])(q[:, a:b], k[:, :, c:d], v[:, :, c:d])
            for a, b, c, d in zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:])
        ]
        return torch.cat([o for o, _ in outs], 1), torch.cat([lse for _, lse in outs], 1)

    return run


def _poison_unselected_varlen(inp: Inputs) -> Inputs:
    """Packed inputs whose keys no row of their own sequence selects are NaN (keys beyond
    every query's position and the other sequences' keys included)."""
    cu_q, cu_k = inp.cu_seqlens_q.tolist(), inp.cu_seqlens_k.tolist()
    sel = torch.cat([selected_keys(inp.ranges[:, a:b], d - c) for a, b, c, d in zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:])], 2)
    unsel = ~sel[..., None]
    return replace(inp, k=torch.where(unsel, float("nan"), inp.k), v=torch.where(unsel, float("nan"), inp.v))


def check(impl: Impl, case: Case, device) -> None:
    """Packed sequences (cu_seqlens) give what each sequence gives on its own; every key that
    no row of its sequence selects holds NaN, so reading one (from a neighbouring sequence,
    or beyond a query's position) shows up. Outputs are poisoned before the call (CUDA)."""
    inp = _poison_unselected_varlen(make_inputs(case, device))
    judged = impl.judged_as(case.dtype)

    def fn(kind):
        if kind == "golden":
            return _per_sequence(lambda r: golden_fn(r, inp.scale), inp)
        return _per_sequence(lambda r: plain_fn(r, inp.scale, judged), inp)

    gold, plain, up = reference_run(fn, inp, case, judged, grads=impl.backward, lse=impl.lse)
    call = guarding(
        lambda q, k, v: impl.forward_varlen(q, k, v, inp.ranges, inp.cu_seqlens_q, inp.cu_seqlens_k, scale=inp.scale),
        ranges=inp.ranges,
        cu_seqlens_q=inp.cu_seqlens_q,
        cu_seqlens_k=inp.cu_seqlens_k,
    )
    got = evaluate(call, inp.q, inp.k, inp.v, up)
    compare(case, judged, got, gold, plain)


FAMILY = Family(
    "varlen",
    "packed sequences equal per-sequence calls",
    rank=10,
    check=check,
    applies=lambda c: c.mode == "varlen",
    requires=(VARLEN,),
)
