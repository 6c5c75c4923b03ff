"""Cross-check of `selgate check fla_nsa:selection`: every failing forward case (parity, decode,
bounds, empty_ranges, group, dtype) recomputed by calling fla-core's `parallel_nsa` directly on
the real queries alone (its forward takes fewer queries than keys: they are the last ones), with
no adapter rows, and compared with what the check saw. A failure that a direct call shows too is
the kernel's; one that disappears would be the adapter's (a false alarm).

    python fla_crosscheck.py selgate-check/junit.xml [--declare fla_nsa.yaml] [--size tiny]

Prints one table row per failing case: family, case, NaN count and max error of o against the
fp64 golden result through the adapter and directly, and whether the direct call fails too."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch
from fla.ops.nsa.parallel import parallel_nsa

from selgate.conformance.adapters import ranges_to_block_indices
from selgate.conformance.cases import make_inputs
from selgate.conformance.registry import resolve
from selgate.reports.repro_case import find_case
from selgate.reports.triage import CASE_ID
from selgate.reference import selection_attention_ref
from selgate.reports.results import read_junit, _nodeid

FORWARD = ("parity", "decode", "bounds", "empty_ranges", "group", "dtype")


def backward_beyond_t(device="cuda"):
    """The bounds family's `dk[tail keys]` NaN on a direct call with every query real (no adapter
    rows): 100 queries over 100 keys in blocks of 64; query 64 selects its own block (keys 64-99,
    those past 64 beyond its position), every later query block 0 only, so keys 65-99 are selected
    by no row and hold NaN. Their dk must be exactly zero; returns how many are NaN instead."""
    T, H, HQ, D, bs = 100, 1, 16, 64, 64
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, T, n, D, generator=gen).to(device) for n in (HQ, H, H))
    ids = torch.full((1, T, H, 1), -1, dtype=torch.int32)
    ids[:, :65] = 0
    ids[:, 64] = 1
    ids[:, 65:] = 0
    unread = torch.zeros(T, dtype=torch.bool)
    unread[65:] = True
    k[:, unread.to(device)] = float("nan")
    v[:, unread.to(device)] = float("nan")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        o = parallel_nsa(
            q,
            k,
            v,
            block_indices=ids.to(device),
            block_counts=torch.ones(1, T, H, dtype=torch.int32, device=device),
            block_size=bs,
            scale=D**-0.5,
        )
    o.backward(torch.randn(o.shape, generator=gen).to(device))
    return int(torch.isfinite(o).logical_not().sum()), int(k.grad[:, unread.to(device)].isnan().sum()), int(unread.sum()) * H * D


def direct(q, k, v, ranges, scale, block_size):
    """fla-core called as its author would: real queries only, block ids from the ranges."""
    B, S, G, h, Dk = q.shape
    ids, counts = ranges_to_block_indices(ranges, block_size, k.shape[2])
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        o = parallel_nsa(
            q.flatten(2, 3).contiguous(),
            k.transpose(1, 2).contiguous(),
            v.transpose(1, 2).contiguous(),
            block_indices=ids,
            block_counts=counts,
            block_size=block_size,
            scale=Dk**-0.5 if scale is None else scale,
        )
    return o.unflatten(2, (G, h))


def _err(o, ref):
    finite = torch.isfinite(ref)
    nan = int((~torch.isfinite(o) & finite).sum())
    err = (o.double() - ref).abs()[finite & torch.isfinite(o)]
    return nan, float(err.max()) if err.numel() else 0.0


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("junit")
    p.add_argument("--impl", default="fla_nsa:selection")
    p.add_argument("--declare")
    p.add_argument("--size", default="tiny")
    args = p.parse_args()
    impl = resolve(args.impl, declare=args.declare)[0]
    rows = []
    for suite in read_junit(Path(args.junit)):
        for case in suite:
            failed = any(type(r).__name__ in ("Failure", "Error") for r in case.result)
            node = _nodeid(case)
            family = node.split("::")[-1].split("[")[0].removeprefix("test_")
            m = CASE_ID.search(node)
            if not failed or family not in FORWARD or m is None:
                continue
            c = find_case(impl, m.group(0), args.size)
            inp = make_inputs(c, "cuda")
            ref = selection_attention_ref(inp.q.double(), inp.k.double(), inp.v.double(), inp.ranges, scale=inp.scale)
            with torch.no_grad():
                via = impl.forward(inp.q, inp.k, inp.v, inp.ranges, scale=inp.scale)[0]
            own = direct(inp.q, inp.k, inp.v, inp.ranges, inp.scale, impl.block_size)
            (n_via, e_via), (n_own, e_own) = _err(via, ref), _err(own, ref)
            rows.append((family, c.id, n_via, e_via, n_own, e_own, bool(torch.equal(via.nan_to_num(7.0), own.nan_to_num(7.0)))))
    print("| family | case | NaN (adapter) | max err (adapter) | NaN (direct) | max err (direct) | same o |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for f, cid, a, b, c, d, same in rows:
        print(f"| {f} | {cid} | {a} | {b:.2e} | {c} | {d:.2e} | {same} |")
    print(f"{len(rows)} failing forward cases; o identical through the adapter and directly in {sum(r[-1] for r in rows)}")
    o_nan, dk_nan, total = backward_beyond_t()
    print(f"direct call, every query real: o non-finite {o_nan}; dk NaN for {dk_nan} of {total} elements of keys no row selects")


if __name__ == "__main__":
    main()
