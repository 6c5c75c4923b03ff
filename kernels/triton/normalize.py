"""Range normalisation in one Triton launch per call (a few (b, s, g) rows per program).

The torch formulation in `selgate.reference.ranges.normalize_ranges` issues about thirty
small ops; on a decode step that host cost (about 1 ms on the H100 host, measured in
docs/design/dispatcher.md) hides the kernel.
This computes the same function (clamp to `[0, min(t+1, S_kv))`, drop empty, sort, merge
overlapping and adjacent, pad with `(0, 0)`) in registers: ranges packed into one int64
key `start * 2^32 + end` are sorted, a running max of ends finds where merged ranges
open, and a second sort lists the openings in order.

The same launch counts what the dispatcher's `stats()` reports (selected tokens and K/V
bytes) by adding each row's length to two device counters: integer adds commute, so the
totals are exact whatever the order, and counting costs no extra launch or host read."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import launch
from .tiles import ceil_div, pow2_at_least

EMPTY = 1 << 62  # sort key of a dropped range: after every real one
MAX_S_KV = 1 << 30  # a real range's sort key `start * 2^32 + end` stays below EMPTY
# Range slots per program (rows x padded n): one program per row left a prefill call with
# 262144 tiny programs and as many pairs of counter atomics on one address.
ROW_SLOTS = 256


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit(do_not_specialize=("S", "G", "S_kv", "N", "R", "srb", "srs", "srg", "srn", "src", "spb", "sps", "kv_bytes"))
def _normalize_kernel(
    r_ptr,
    pos_ptr,
    out_ptr,
    count_ptr,
    S,
    G,
    S_kv,
    N,
    R,
    srb,
    srs,
    srg,
    srn,
    src,
    spb,
    sps,
    kv_bytes,
    HAS_POS: tl.constexpr,
    COUNT: tl.constexpr,
    N_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    EMPTY_KEY: tl.constexpr,
):
    """ROWS rows of R per program; every step works along axis 1 (a row's range slots)."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    live = row < R
    b = row // (S * G)
    s = (row // G) % S
    g = row % G
    if HAS_POS:
        t = tl.load(pos_ptr + b * spb + s * sps, mask=live, other=0).to(tl.int64)
    else:
        t = s + S_kv - S
    lim = tl.minimum(tl.maximum(t + 1, 0), S_kv)[:, None]
    j = tl.arange(0, N_PAD)[None, :] + tl.zeros([ROWS, N_PAD], tl.int32)  # slot index, full shape for gathers
    inside = (j < N) & live[:, None]
    base = r_ptr + (b * srb + s * srs + g * srg)[:, None] + j.to(tl.int64) * srn
    start = tl.load(base, mask=inside, other=0).to(tl.int64)
    end = tl.load(base + src, mask=inside, other=0).to(tl.int64)
    start = tl.minimum(tl.maximum(start, 0), lim)
    end = tl.minimum(tl.maximum(end, 0), lim)
    real = inside & (end > start)
    key = tl.sort(tl.where(real, start * 4294967296 + end, EMPTY_KEY), 1)
    real = key < EMPTY_KEY
    start = key // 4294967296
    end = key % 4294967296
    n_real = tl.sum(real.to(tl.int32), 1)[:, None]
    reach = tl.associative_scan(tl.where(real, end, -1), 1, _max_combine)
    prev_reach = tl.where(j > 0, tl.gather(reach, tl.maximum(j - 1, 0), 1), -1)
    opens = real & (start > prev_reach)
    n_out = tl.sum(opens.to(tl.int32), 1)[:, None]
    first = tl.sort(tl.where(opens, j, N_PAD + j), 1)  # slots of the openings, in order
    last = tl.where(j + 1 < n_out, tl.gather(first, tl.minimum(j + 1, N_PAD - 1), 1) - 1, n_real - 1)
    keep = j < n_out
    out_start = tl.where(keep, tl.gather(start, tl.minimum(first, N_PAD - 1), 1), 0)
    out_end = tl.where(keep, tl.gather(reach, tl.maximum(last, 0), 1), 0)
    obase = out_ptr + row[:, None] * N * 2 + j.to(tl.int64) * 2  # `out` is contiguous
    tl.store(obase, out_start.to(out_ptr.dtype.element_ty), mask=inside)
    tl.store(obase + 1, out_end.to(out_ptr.dtype.element_ty), mask=inside)
    if COUNT:  # one pair of adds per program: dead rows and padding slots hold 0
        L = tl.sum(tl.sum(out_end - out_start, 1), 0)
        tl.atomic_add(count_ptr, L)
        tl.atomic_add(count_ptr + 1, L * kv_bytes)


def normalize_ranges_triton(
    ranges: torch.Tensor, S_kv: int, positions=None, out=None, counter: torch.Tensor | None = None, kv_bytes_per_key: int = 0
) -> torch.Tensor:
    """Same contract and result as `selgate.reference.normalize_ranges`, in one launch.

    `out` (contiguous, same shape and dtype) is written in full (tests poison it).
    `counter` (int64 [2], same device) gets the selected tokens and `kv_bytes_per_key` times
    them added."""
    if S_kv > MAX_S_KV:
        raise ValueError(
            f"S_kv: {S_kv} > 2^30, beyond the packed sort key of this kernel; selgate.reference.normalize_ranges takes any S_kv"
        )
    B, S, G, n, _ = ranges.shape
    out = torch.empty(ranges.shape, dtype=ranges.dtype, device=ranges.device) if out is None else out
    if not out.is_contiguous():
        raise ValueError(f"out: expected a contiguous tensor, got strides {out.stride()}")
    if out.numel() == 0:
        return out
    pos = positions if positions is not None else ranges
    sp = positions.stride() if positions is not None else (0, 0)
    n_pad = pow2_at_least(n, 2)
    rows_per = max(1, ROW_SLOTS // n_pad)
    R = B * S * G
    launch(
        _normalize_kernel,
        (ceil_div(R, rows_per),),
        ranges,
        pos,
        out,
        counter if counter is not None else ranges,
        S,
        G,
        S_kv,
        n,
        R,
        *ranges.stride(),
        *sp,
        int(kv_bytes_per_key),
        HAS_POS=positions is not None,
        COUNT=counter is not None,
        N_PAD=n_pad,
        ROWS=rows_per,
        EMPTY_KEY=EMPTY,
    )
    return out
