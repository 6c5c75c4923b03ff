"""Triton backward of selection attention: deterministic dq, dk, dv without atomics.

- `delta = rowsum(do * o) - dlse` per (b, s, g, head): a small preprocess kernel.
- dq: one program per (b, s, g) for all `h` heads; it walks the row's selected keys in one
  flat tile loop across range boundaries (tiles.py, as the forward), recomputes
  `p = exp(scale * q.k - lse)` from the saved LSE and accumulates in fp32. Only keys inside
  `[start, min(end, t + 1))` are ever loaded. With `dq_tma` (SM >= 9.0) each range's whole
  tiles come through tensor descriptors and only the remainders are gathered, as in fwd.py.
- dk, dv: an inverse index built with torch ops on the device lists, for every
  `(b, g, KV tile of BLOCK_N keys)`, the (query row, key interval) pairs that touch the
  tile, in a fixed order (stable sort of pairs generated row-major). One program per chunk
  of at most `chunk` pairs walks its pairs in that order, `ROWS` rows x `h` heads at a time
  as one MMA operand, and accumulates dk, dv in fp32 registers. A tile served by one chunk
  writes its result directly; a tile split into several chunks (a block every row selects)
  writes fp32 partials that a reduce kernel sums in chunk order. No atomics anywhere, so
  results are bitwise reproducible; keys no row selected keep exact zeros.
- dq from the pairs (`dq_kv_outer_max_heads` >= h): the dk/dv kernel, which has every pair's
  `ds` in registers, also writes each pair's share of dq to the pair's row-major slot
  (inverse_index.py), and a small kernel sums each row's slots in order; no dq kernel, so no
  row reloads its selected keys. It costs pairs x h x Dk fp32 of memory, so it is for few heads
  a group (the profile says how few, as for the KV-outer forward), and a call whose shares
  would pass `inverse_index.PARTIALS_BUDGET` takes the dq kernel instead.

Host syncs: two small reads while building the index (the number of (row, tile) pairs,
then the number of work items and partial slots) size the index and the grid, so the
backward cannot be captured in a CUDA graph (it says so instead of failing mid-capture). On
CUDA the index is built on a side stream that first waits for the caller's stream up to the
delta kernel; the dq kernel is queued on the caller's stream after that point, so the host
reads do not wait for dq, and the index's small kernels overlap it. With `overlap` the dk/dv
kernels follow on the side stream, beside dq. dq and dk/dv read the same inputs and write disjoint outputs, so
running them side by side changes no sum's order: results stay bitwise reproducible.
Extra memory: the index, O(B*S*G*(n + L/BLOCK_N)) integers, plus fp32 partials for split
tiles only.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
import triton
import triton.language as tl

from selgate.kernels.config import load_config
from selgate.reference.ranges import key_limit
from selgate.reference.validation import check_inputs

from . import tuning
from .fwd import INT32_MAX, tma_descriptors, tma_supported
from . import inverse_index
from .inverse_index import InverseIndex
from .tiles import block_key, ceil_div, gather_keys, keys_used, pow2_at_least, work_item

LOG2E = 1.4426950408889634
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
DEFAULT_CHUNK = 2048  # pairs per dk/dv work item; bounds the longest program


@triton.jit
def _delta_kernel(
    o_ptr, do_ptr, dlse_ptr, delta_ptr, n_rows, Dv, HAS_DLSE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_DV: tl.constexpr
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_DV)
    rm = rows < n_rows
    m = rm[:, None] & (cols[None, :] < Dv)
    off = rows[:, None] * Dv + cols[None, :]
    o = tl.load(o_ptr + off, mask=m, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + off, mask=m, other=0.0).to(tl.float32)
    d = tl.sum(o * do, axis=1)
    if HAS_DLSE:
        d -= tl.load(dlse_ptr + rows, mask=rm, other=0.0).to(tl.float32)
    tl.store(delta_ptr + rows, d, mask=rm)


@triton.jit
def _dq_step(acc, q, do, lse, delta, hm, kt, vt, ok, qk_scale_log2, PRECISION: tl.constexpr, MASKED: tl.constexpr):
    """dq += ds . k for one tile kt [keys, DK], vt [keys, DV]; `ok` masks keys when MASKED
    (a tile through the tensor descriptors holds only selected keys)."""
    sc = tl.dot(q, tl.trans(kt), input_precision=PRECISION)
    pm = hm[:, None] & ok[None, :] if MASKED else hm[:, None]
    p = tl.where(pm, tl.exp2(sc * qk_scale_log2 - lse[:, None]), 0.0)
    dp = tl.dot(do, tl.trans(vt), input_precision=PRECISION)
    ds = p * (dp - delta[:, None])
    return tl.dot(ds.to(kt.dtype), kt, acc, input_precision=PRECISION)


@triton.jit
def _dq_gather(
    acc,
    q,
    do,
    lse,
    delta,
    hm,
    k_grp,
    v_grp,
    p0,
    start,
    first,
    stop,
    L,
    lim,
    dks,
    dkm,
    dvs,
    dvm,
    Dk,
    Dv,
    qk_scale_log2,
    PRECISION: tl.constexpr,
    TILE: tl.constexpr,
):
    """Tile positions [p0, p0 + TILE) of the row's selection, gathered with masked loads."""
    key, ok = gather_keys(p0, start, first, stop, L, lim, TILE)
    kt = tl.load(k_grp + key[:, None] * Dk + dks[None, :], mask=ok[:, None] & dkm[None, :], other=0.0)
    vt = tl.load(v_grp + key[:, None] * Dv + dvs[None, :], mask=ok[:, None] & dvm[None, :], other=0.0)
    return _dq_step(acc, q, do, lse, delta, hm, kt, vt, ok, qk_scale_log2, PRECISION, True)


@triton.jit
def _dq_gathers(
    acc,
    q,
    do,
    lse,
    delta,
    hm,
    k_grp,
    v_grp,
    start,
    length,
    lim,
    dks,
    dkm,
    dvs,
    dvm,
    Dk,
    Dv,
    qk_scale_log2,
    PRECISION: tl.constexpr,
    TILE: tl.constexpr,
):
    """Every key of the ranges `[start, start + length)`, in TILE-position gather tiles (tiles.py)."""
    stop = tl.cumsum(length, 0)
    first = stop - length
    L = tl.sum(length, 0)
    for p0 in tl.range(0, L, TILE):
        acc = _dq_gather(
            acc,
            q,
            do,
            lse,
            delta,
            hm,
            k_grp,
            v_grp,
            p0,
            start,
            first,
            stop,
            L,
            lim,
            dks,
            dkm,
            dvs,
            dvm,
            Dk,
            Dv,
            qk_scale_log2,
            PRECISION,
            TILE,
        )
    return acc


@triton.jit
def _dq_block(
    acc,
    q,
    do,
    lse,
    delta,
    hm,
    k_desc,
    v_desc,
    b,
    g,
    i,
    j,
    start,
    nfull,
    cum,
    qk_scale_log2,
    PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """Whole tile `i` of the row: BLOCK_N selected keys through the tensor descriptors (columns
    past Dk, Dv read as zeros)."""
    key0 = block_key(i, j, start, nfull, cum, BLOCK_N)
    kt = tl.reshape(k_desc.load([b, g, key0, 0]), (BLOCK_N, BLOCK_DK))
    vt = tl.reshape(v_desc.load([b, g, key0, 0]), (BLOCK_N, BLOCK_DV))
    return _dq_step(acc, q, do, lse, delta, hm, kt, vt, 0, qk_scale_log2, PRECISION, False)


@triton.jit
def _dq_blocks(
    acc,
    q,
    do,
    lse,
    delta,
    hm,
    k_desc,
    v_desc,
    b,
    g,
    j,
    start,
    nfull,
    qk_scale_log2,
    PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """The `nfull` whole BLOCK_N-key tiles of every range, one tensor-descriptor load each."""
    cum = tl.cumsum(nfull, 0)
    F = tl.sum(nfull, 0)
    for i in tl.range(0, F):
        acc = _dq_block(
            acc,
            q,
            do,
            lse,
            delta,
            hm,
            k_desc,
            v_desc,
            b,
            g,
            i,
            j,
            start,
            nfull,
            cum,
            qk_scale_log2,
            PRECISION,
            BLOCK_N,
            BLOCK_DK,
            BLOCK_DV,
        )
    return acc


@triton.jit
def _dq_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    k_desc,
    v_desc,
    do_ptr,
    lse_ptr,
    delta_ptr,
    r_ptr,
    lim_ptr,
    dq_ptr,
    S,
    G,
    S_kv,
    n_r,
    h,
    Dk,
    Dv,
    scale,
    qk_scale_log2,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    N_PAD: tl.constexpr,
    PRECISION: tl.constexpr,
    TMA: tl.constexpr,
    TAIL_N: tl.constexpr,
):
    s = tl.program_id(0).to(tl.int64)
    bg = tl.program_id(1).to(tl.int64)
    b = bg // G
    g = bg % G
    row = (b * S + s) * G + g
    heads = tl.arange(0, BLOCK_H)
    dks = tl.arange(0, BLOCK_DK)
    dvs = tl.arange(0, BLOCK_DV)
    hm = heads < h
    dkm = dks < Dk
    dvm = dvs < Dv
    qrow = row * h + heads
    q = tl.load(q_ptr + qrow[:, None] * Dk + dks[None, :], mask=hm[:, None] & dkm[None, :], other=0.0)
    do = tl.load(do_ptr + qrow[:, None] * Dv + dvs[None, :], mask=hm[:, None] & dvm[None, :], other=0.0)
    lse = tl.load(lse_ptr + qrow, mask=hm, other=0.0) * 1.4426950408889634
    delta = tl.load(delta_ptr + qrow, mask=hm, other=0.0)
    # The row's ranges, clamped to [0, lim) (lim: keys >= t + 1 are never read).
    lim = tl.load(lim_ptr + b * S + s).to(tl.int32)
    j = tl.arange(0, N_PAD)
    r_row = r_ptr + (row * n_r + j) * 2
    start = tl.minimum(tl.maximum(tl.load(r_row, mask=j < n_r, other=0).to(tl.int32), 0), lim)
    end = tl.minimum(tl.maximum(tl.load(r_row + 1, mask=j < n_r, other=0).to(tl.int32), 0), lim)
    length = tl.maximum(end - start, 0)
    k_grp = k_ptr + bg * S_kv * Dk
    v_grp = v_ptr + bg * S_kv * Dv
    acc = tl.zeros([BLOCK_H, BLOCK_DK], dtype=tl.float32)
    if TMA:  # whole tiles through the tensor descriptors, remainders gathered (as in fwd.py)
        nfull = length // BLOCK_N
        acc = _dq_blocks(
            acc,
            q,
            do,
            lse,
            delta,
            hm,
            k_desc,
            v_desc,
            b.to(tl.int32),
            g.to(tl.int32),
            j,
            start,
            nfull,
            qk_scale_log2,
            PRECISION,
            BLOCK_N,
            BLOCK_DK,
            BLOCK_DV,
        )
        acc = _dq_gathers(
            acc,
            q,
            do,
            lse,
            delta,
            hm,
            k_grp,
            v_grp,
            start + nfull * BLOCK_N,
            length - nfull * BLOCK_N,
            lim,
            dks,
            dkm,
            dvs,
            dvm,
            Dk,
            Dv,
            qk_scale_log2,
            PRECISION,
            TAIL_N,
        )
    else:
        acc = _dq_gathers(
            acc,
            q,
            do,
            lse,
            delta,
            hm,
            k_grp,
            v_grp,
            start,
            length,
            lim,
            dks,
            dkm,
            dvs,
            dvm,
            Dk,
            Dv,
            qk_scale_log2,
            PRECISION,
            BLOCK_N,
        )
    tl.store(
        dq_ptr + qrow[:, None] * Dk + dks[None, :], (acc * scale).to(dq_ptr.dtype.element_ty), mask=hm[:, None] & dkm[None, :]
    )


@triton.jit
def _dkdv_step(
    acc_dk,
    acc_dv,
    i,
    p1,
    kt,
    vt,
    keys,
    r_of_c,
    head,
    q_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    pair_row_ptr,
    pair_lo_ptr,
    pair_hi_ptr,
    h,
    Dk,
    Dv,
    dks,
    dkm,
    dvs,
    dvm,
    qk_scale_log2,
    pair_slot_ptr,
    pdq_ptr,
    PRECISION: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    DQ: tl.constexpr,
):
    """One MMA step: pairs i .. i+ROWS-1 of the tile's list, all heads of each. With DQ, also
    each pair's share of dq (unscaled), stored at the pair's row-major slot."""
    pidx = i + r_of_c
    pm = pidx < p1
    cm = pm & (head < h)
    row = tl.load(pair_row_ptr + pidx, mask=pm, other=0).to(tl.int64)
    lo = tl.load(pair_lo_ptr + pidx, mask=pm, other=0)
    hi = tl.load(pair_hi_ptr + pidx, mask=pm, other=0)
    qrow = row * h + head
    qg = tl.load(q_ptr + qrow[:, None] * Dk + dks[None, :], mask=cm[:, None] & dkm[None, :], other=0.0)
    dog = tl.load(do_ptr + qrow[:, None] * Dv + dvs[None, :], mask=cm[:, None] & dvm[None, :], other=0.0)
    lse = tl.load(lse_ptr + qrow, mask=cm, other=0.0) * 1.4426950408889634
    delta = tl.load(delta_ptr + qrow, mask=cm, other=0.0)
    sel = (keys[:, None] >= lo[None, :]) & (keys[:, None] < hi[None, :]) & cm[None, :]
    st = tl.dot(kt, tl.trans(qg), input_precision=PRECISION)  # [BLOCK_N, ROWS*BLOCK_H]
    pt = tl.where(sel, tl.exp2(st * qk_scale_log2 - lse[None, :]), 0.0)
    acc_dv = tl.dot(pt.to(dog.dtype), dog, acc_dv, input_precision=PRECISION)
    dpt = tl.dot(vt, tl.trans(dog), input_precision=PRECISION)
    dst = tl.where(sel, pt * (dpt - delta[None, :]), 0.0)  # where, not *: unselected keys may hold NaN
    acc_dk = tl.dot(dst.to(qg.dtype), qg, acc_dk, input_precision=PRECISION)
    if DQ:
        dqp = tl.dot(tl.trans(dst.to(kt.dtype)), kt, input_precision=PRECISION)
        slot = tl.load(pair_slot_ptr + pidx, mask=pm, other=0).to(tl.int64)
        tl.store(pdq_ptr + (slot * h + head)[:, None] * BLOCK_DK + dks[None, :], dqp, mask=cm[:, None])
    return acc_dk, acc_dv


@triton.jit
def _dkdv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    pair_row_ptr,
    pair_lo_ptr,
    pair_hi_ptr,
    item_seg_ptr,
    item_start_ptr,
    item_end_ptr,
    item_slot_ptr,
    dk_ptr,
    dv_ptr,
    pdk_ptr,
    pdv_ptr,
    pair_slot_ptr,
    pdq_ptr,
    n_tiles,
    S_kv,
    h,
    Dk,
    Dv,
    scale,
    qk_scale_log2,
    ROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr,
    DQ: tl.constexpr,
):
    bg, keys, p0, p1 = work_item(item_seg_ptr, item_start_ptr, item_end_ptr, n_tiles, BLOCK_N)
    km = keys < S_kv
    dks = tl.arange(0, BLOCK_DK)
    dvs = tl.arange(0, BLOCK_DV)
    dkm = dks < Dk
    dvm = dvs < Dv
    kv_rows = bg * S_kv + keys
    k_in = km
    if DQ:  # the dq product multiplies K by zeros at keys no pair selects: they must not be NaN
        k_in = km & keys_used(keys, pair_lo_ptr, pair_hi_ptr, p0, p1, 64)
    kt = tl.load(k_ptr + kv_rows[:, None] * Dk + dks[None, :], mask=k_in[:, None] & dkm[None, :], other=0.0)
    vt = tl.load(v_ptr + kv_rows[:, None] * Dv + dvs[None, :], mask=km[:, None] & dvm[None, :], other=0.0)
    cols = tl.arange(0, ROWS * BLOCK_H)  # column = (pair r, head i) of the gathered operand
    r_of_c = cols // BLOCK_H
    head = cols % BLOCK_H
    acc_dk = tl.zeros([BLOCK_N, BLOCK_DK], dtype=tl.float32)
    acc_dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    for i in range(p0, p1, ROWS):
        acc_dk, acc_dv = _dkdv_step(
            acc_dk,
            acc_dv,
            i,
            p1,
            kt,
            vt,
            keys,
            r_of_c,
            head,
            q_ptr,
            do_ptr,
            lse_ptr,
            delta_ptr,
            pair_row_ptr,
            pair_lo_ptr,
            pair_hi_ptr,
            h,
            Dk,
            Dv,
            dks,
            dkm,
            dvs,
            dvm,
            qk_scale_log2,
            pair_slot_ptr,
            pdq_ptr,
            PRECISION,
            BLOCK_DK,
            DQ,
        )
    acc_dk = acc_dk * scale
    slot = tl.load(item_slot_ptr + tl.program_id(0)).to(tl.int64)
    if slot < 0:
        tl.store(
            dk_ptr + kv_rows[:, None] * Dk + dks[None, :], acc_dk.to(dk_ptr.dtype.element_ty), mask=km[:, None] & dkm[None, :]
        )
        tl.store(
            dv_ptr + kv_rows[:, None] * Dv + dvs[None, :], acc_dv.to(dv_ptr.dtype.element_ty), mask=km[:, None] & dvm[None, :]
        )
    else:
        tiles = tl.arange(0, BLOCK_N)
        tl.store(pdk_ptr + (slot * BLOCK_N + tiles)[:, None] * BLOCK_DK + dks[None, :], acc_dk)
        tl.store(pdv_ptr + (slot * BLOCK_N + tiles)[:, None] * BLOCK_DV + dvs[None, :], acc_dv)


@triton.jit
def _reduce_partials_kernel(
    pdk_ptr,
    pdv_ptr,
    multi_seg_ptr,
    multi_slot_ptr,
    multi_count_ptr,
    dk_ptr,
    dv_ptr,
    n_tiles,
    S_kv,
    Dk,
    Dv,
    BLOCK_N: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    u = tl.program_id(0)
    seg = tl.load(multi_seg_ptr + u).to(tl.int64)
    slot0 = tl.load(multi_slot_ptr + u).to(tl.int64)
    count = tl.load(multi_count_ptr + u)
    tiles = tl.arange(0, BLOCK_N)
    keys = (seg % n_tiles) * BLOCK_N + tiles
    km = keys < S_kv
    dks = tl.arange(0, BLOCK_DK)
    dvs = tl.arange(0, BLOCK_DV)
    acc_dk = tl.zeros([BLOCK_N, BLOCK_DK], dtype=tl.float32)
    acc_dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    c = 0
    while c < count:  # chunk order is fixed, so the sum is reproducible
        acc_dk += tl.load(pdk_ptr + ((slot0 + c) * BLOCK_N + tiles)[:, None] * BLOCK_DK + dks[None, :])
        acc_dv += tl.load(pdv_ptr + ((slot0 + c) * BLOCK_N + tiles)[:, None] * BLOCK_DV + dvs[None, :])
        c += 1
    kv_rows = (seg // n_tiles) * S_kv + keys
    tl.store(
        dk_ptr + kv_rows[:, None] * Dk + dks[None, :], acc_dk.to(dk_ptr.dtype.element_ty), mask=km[:, None] & (dks[None, :] < Dk)
    )
    tl.store(
        dv_ptr + kv_rows[:, None] * Dv + dvs[None, :], acc_dv.to(dv_ptr.dtype.element_ty), mask=km[:, None] & (dvs[None, :] < Dv)
    )


@triton.jit
def _sum_dq_kernel(
    pdq_ptr,
    row_end_ptr,
    row_pairs_ptr,
    dq_ptr,
    h,
    Dk,
    scale,
    BLOCK_H: tl.constexpr,
    BLOCK_DK: tl.constexpr,
):
    """dq of one (b, s, g) row: its pairs' shares summed in slot order (fixed: reproducible)."""
    row = tl.program_id(0).to(tl.int64)
    p1 = tl.load(row_end_ptr + row)
    p0 = p1 - tl.load(row_pairs_ptr + row)
    heads = tl.arange(0, BLOCK_H)
    hm = heads < h
    dks = tl.arange(0, BLOCK_DK)
    acc = tl.zeros([BLOCK_H, BLOCK_DK], tl.float32)
    for j in tl.range(p0, p1):
        acc += tl.load(pdq_ptr + (j * h + heads)[:, None] * BLOCK_DK + dks[None, :], mask=hm[:, None], other=0.0)
    out = row * h + heads
    tl.store(
        dq_ptr + out[:, None] * Dk + dks[None, :],
        (acc * scale).to(dq_ptr.dtype.element_ty),
        mask=hm[:, None] & (dks[None, :] < Dk),
    )


@functools.lru_cache(maxsize=None)
def _stream_of(device_index: int) -> torch.cuda.Stream:
    # High priority: the index's small kernels and the dk/dv programs take SMs as dq's
    # programs retire instead of queueing behind all of them.
    return torch.cuda.Stream(device_index, priority=-1)


def _side_stream(device: torch.device) -> torch.cuda.Stream | None:
    """The stream the inverse index is built on (its two host reads then wait for the index
    work and what the caller queued before it), and with `overlap` the dk/dv kernels run on,
    beside the dq kernel on the current stream; None off CUDA."""
    if device.type != "cuda":
        return None
    return _stream_of(device.index if device.index is not None else torch.cuda.current_device())


def _check_like(name: str, t: torch.Tensor, shape: tuple, dtype=None) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {t.dtype}")


def _pow2(x: int, lo: int = 16) -> int:
    return pow2_at_least(x, lo)


def launch_config(Dk: int, Dv: int, dtype: torch.dtype, *, S_kv=None, n=None, kind=None, tune=None) -> dict:
    """Launch parameters of the backward (keys of `default_config`), chosen by
    `tuning.bwd_config`, cached per (kind, Dk, Dv, L bucket of (S_kv, n), dtype): env
    `SELGATE_TRITON_BWD_CONFIG` > persisted tuned config (`configs/tuned/`) > `default_config`.
    No kernel here accumulates into its output (dk/dv are zero-filled by `triton_backward`
    before every launch), so tuning reruns need no reset_to_zero."""
    kind = kind or ("interpreter" if INTERPRET else "prefill")
    return tuning.bwd_config(Dk, Dv, dtype, kind, S_kv=S_kv, n=n, default=default_config, tune=tune)


def default_config(Dk: int, Dv: int, dtype: torch.dtype) -> dict:
    """Built-in launch parameters: `dq_*` for the dq kernel (`dq_tma`: whole `dq_block_n`-key
    tiles of each range through tensor descriptors, the remainders in `dq_tail_n`-key
    gathers; it takes effect on SM >= 9.0 only); `block_n` (KV tile), `block_m` ((query row
    x head) columns of one MMA), `warps`, `stages` and `chunk` (pairs per program) for dk/dv;
    `overlap`: dk/dv on a second stream beside dq (CUDA), which changes no sum's order.
    Head dims above 128 and fp32 (IEEE dots, no tensor cores) take smaller tiles to stay
    within 255 registers (sm90 compiles). For fp16/bf16 with head dims <= 128, dk/dv's
    `block_m` and `stages` come from the device profile (`triton_bwd`, configs/): the dk/dv
    loop gathers its query rows through an index it loads in the same loop, so Triton's
    pipeliner prefetches them `(stages - 1) // 2` steps ahead, and a deep pipeline needs the
    shared memory of a large-smem GPU. Measured on the H100 at the T=65536 benchmark
    (docs/design/triton-backward.md): dk/dv with 4 warps, two programs per SM, beat
    one of 8 warps (45.2 vs 58.2 ms for the whole backward); dq through descriptors with 2
    warps and 3 stages took the backward from 43.4 to 35.8 ms; dk/dv with 7 stages and
    block_m 32 took the dk/dv kernel from 16.8 to 14.8 ms."""
    small = max(_pow2(Dk), _pow2(Dv)) <= 128
    if dtype == torch.float32:
        return dict(
            dq_block_n=32 if small else 16,
            dq_warps=4,
            dq_stages=2,
            dq_tma=True,
            dq_tail_n=16,
            block_n=32 if small else 16,
            block_m=16,
            warps=8,
            stages=2,
            chunk=DEFAULT_CHUNK,
            overlap=True,
            dq_kv_outer_max_heads=0,
        )
    prof = load_config()["triton_bwd"]
    return dict(
        dq_block_n=64 if small else 32,
        dq_warps=2 if small else 4,
        dq_stages=3 if small else 2,
        dq_tma=True,
        dq_tail_n=32 if small else 16,
        block_n=64 if small else 32,
        block_m=int(prof["block_m"]) if small else 32,
        warps=4 if small else 8,
        stages=int(prof["stages"]) if small else 2,
        chunk=DEFAULT_CHUNK,
        overlap=True,
        dq_kv_outer_max_heads=int(prof.get("dq_kv_outer_max_heads", 0)),
    )


def triton_backward(
    q, k, v, o, lse, do, norm_ranges, *, scale: float, positions=None, dlse=None, out=None, config: dict | None = None
):
    """Gradients `(dq, dk, dv)` of selection attention, in the dtype of `q`, `k`, `v`.

    `norm_ranges` must be normalised (`normalize_ranges`); `o` and `lse` come from the
    forward, `do` is the gradient of `o`, `dlse` (optional) the gradient of `lse`.
    `out` = `(dq, dk, dv)` contiguous tensors to write into (tests poison them; dk and dv
    are zero-filled first, since tiles no row selected are never visited). `config`
    overrides keys of `launch_config` (tests shrink tiles, benchmarks sweep): tuning knobs
    that never change the math."""
    d = check_inputs(q, k, v, norm_ranges, scale=scale, positions=positions)
    if d.S_kv > INT32_MAX:
        raise ValueError(f"k: S_kv={d.S_kv} > 2^31 - 1; the Triton backward counts keys in int32")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"q: the Triton backward takes fp16, bf16 or fp32, got {q.dtype}")
    for name, dim in (("Dk", d.Dk), ("Dv", d.Dv)):
        if dim % 8 or dim > 256:
            raise ValueError(f"{name}={dim}: the Triton backward needs a head dim that is a multiple of 8, at most 256")
    if q.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "triton_backward: cannot run under CUDA graph capture: building the inverse index reads two sizes on the host"
        )
    kind = "interpreter" if q.device.type == "cpu" else "prefill"  # decode backward is tuned as prefill
    cfg = launch_config(
        d.Dk,
        d.Dv,
        q.dtype,
        S_kv=d.S_kv,
        n=d.n,
        kind=kind,
        tune=None
        if config
        else (
            lambda default: tuning.tune_bwd(
                lambda c: triton_backward(
                    q, k, v, o, lse, do, norm_ranges, scale=scale, positions=positions, dlse=dlse, config=c
                ),
                default=default,
                do_bench=tuning.device_bench(q.device),
            )["config"]
        ),
    )
    unknown = set(config or {}) - set(cfg)
    if unknown:
        raise ValueError(f"config: unknown keys {sorted(unknown)}; expected some of {sorted(cfg)}")
    cfg.update(config or {})
    for key in ("block_m", "dq_tail_n"):
        if cfg[key] < 16 or cfg[key] & (cfg[key] - 1):
            raise ValueError(f"config[{key!r}]={cfg[key]}: expected a power of two >= 16")
    _check_like("o", o, (d.B, d.S, d.G, d.h, d.Dv))
    _check_like("do", do, (d.B, d.S, d.G, d.h, d.Dv))
    _check_like("lse", lse, (d.B, d.S, d.G, d.h), torch.float32)
    if dlse is not None:
        _check_like("dlse", dlse, (d.B, d.S, d.G, d.h))
    q, k, v, o, lse, norm_ranges = (t.contiguous() for t in (q, k, v, o, lse, norm_ranges))
    do = do.to(q.dtype).contiguous()
    lim = key_limit(norm_ranges, d.S_kv, positions)[:, :, 0, 0].contiguous()
    precision = "ieee" if q.dtype == torch.float32 else "tf32"  # tf32 is unused by fp16/bf16 dots
    BLOCK_H = _pow2(d.h)  # dq: the h heads of one row are the MMA's M side (at least 16)
    if q.device.type == "cuda":
        with torch.cuda.device(q.device):  # Triton launches on the current device's stream
            return _launch(q, k, v, o, lse, do, dlse, norm_ranges, lim, out, d, cfg, scale, precision, BLOCK_H)
    return _launch(q, k, v, o, lse, do, dlse, norm_ranges, lim, out, d, cfg, scale, precision, BLOCK_H)


def _launch(q, k, v, o, lse, do, dlse, norm_ranges, lim, out, d, cfg: dict, scale: float, precision: str, BLOCK_H: int):
    """delta, dq and the inverse index, then dk/dv (on the side stream with `overlap`)."""
    BLOCK_DV = _pow2(d.Dv)
    n_rows = d.B * d.S * d.G * d.h
    delta = torch.empty(n_rows, dtype=torch.float32, device=q.device)
    _delta_kernel[(ceil_div(n_rows, 32),)](
        o,
        do,
        dlse.float().contiguous() if dlse is not None else delta,
        delta,
        n_rows,
        d.Dv,
        HAS_DLSE=dlse is not None,
        BLOCK_R=32,
        BLOCK_DV=BLOCK_DV,
    )
    side = _side_stream(q.device)
    if side is not None:  # the index reads norm_ranges and lim, the dk/dv kernel delta
        side.wait_stream(torch.cuda.current_stream(q.device))

    dq, dk, dv = out if out is not None else (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    for name, got, like in (("out[0]", dq, q), ("out[1]", dk, k), ("out[2]", dv, v)):
        _check_like(name, got, like.shape, like.dtype)
        if not got.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor, got strides {got.stride()}")
    fused = d.h <= cfg["dq_kv_outer_max_heads"]  # dq from the dk/dv kernel's pairs, no dq kernel
    if not fused:
        _dq(q, k, v, do, lse, delta, norm_ranges, lim, dq, d, cfg, scale, precision, BLOCK_H)

    bn = cfg["block_n"]
    main = torch.cuda.current_stream(q.device) if side is not None else None
    try:
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            idx = InverseIndex(norm_ranges, lim, d.G, d.S_kv, bn, cfg["chunk"])
        if fused and idx.n_pairs * d.h * _pow2(d.Dk) * 4 > inverse_index.PARTIALS_BUDGET:
            fused = False  # the dq shares would not fit: the dq kernel, after the index
            _dq(q, k, v, do, lse, delta, norm_ranges, lim, dq, d, cfg, scale, precision, BLOCK_H)
        if side is not None and not cfg["overlap"]:  # dk/dv after dq, on the caller's stream
            main.wait_stream(side)
            idx.record_stream(main)
        with torch.cuda.stream(side) if side is not None and cfg["overlap"] else contextlib.nullcontext():
            _dkdv(q, k, v, do, lse, delta, idx, dk, dv, d, cfg, scale, precision, dq if fused else None)
    finally:  # also on an error: nothing the caller frees may still be in use on the side stream
        if side is not None:
            main.wait_stream(side)
    return dq, dk, dv


def _dq(q, k, v, do, lse, delta, norm_ranges, lim, dq, d, cfg: dict, scale: float, precision: str, BLOCK_H: int) -> None:
    """dq by its own kernel: one program per (b, s, g) row walks the row's selected keys."""
    BLOCK_DK, BLOCK_DV = _pow2(d.Dk), _pow2(d.Dv)
    tma = bool(cfg["dq_tma"]) and tma_supported(k, v)
    descs = tma_descriptors(k, v, cfg["dq_block_n"]) if tma else (None, None)
    _dq_kernel[(d.S, d.B * d.G)](
        q,
        k,
        v,
        *descs,
        do,
        lse,
        delta,
        norm_ranges,
        lim,
        dq,
        d.S,
        d.G,
        d.S_kv,
        d.n,
        d.h,
        d.Dk,
        d.Dv,
        scale,
        scale * LOG2E,
        BLOCK_H=BLOCK_H,
        BLOCK_N=cfg["dq_block_n"],
        BLOCK_DK=BLOCK_DK,
        BLOCK_DV=BLOCK_DV,
        N_PAD=_pow2(d.n),
        PRECISION=precision,
        TMA=tma,
        TAIL_N=cfg["dq_tail_n"],
        num_warps=cfg["dq_warps"],
        num_stages=cfg["dq_stages"],
    )


def _dkdv(q, k, v, do, lse, delta, idx: InverseIndex, dk, dv, d, cfg: dict, scale: float, precision: str, dq=None) -> None:
    """dk and dv from the inverse index, on the current stream: zero-filled (tiles no row
    selected are never visited), one program per work item, then split tiles' partials summed.
    Given `dq`, also dq: each pair's share written to its row-major slot (pairs x h x Dk fp32),
    then summed per row in slot order."""
    bn = cfg["block_n"]
    BLOCK_DK, BLOCK_DV = _pow2(d.Dk), _pow2(d.Dv)
    heads_kv = pow2_at_least(d.h)  # block_m // heads_kv rows share one MMA
    qk_scale_log2 = scale * LOG2E
    dk.zero_()
    dv.zero_()
    pdk = torch.empty(max(idx.n_slots, 1) * bn * BLOCK_DK, dtype=torch.float32, device=q.device)
    pdv = torch.empty(max(idx.n_slots, 1) * bn * BLOCK_DV, dtype=torch.float32, device=q.device)
    pdq = torch.empty(max(idx.n_pairs, 1) * d.h * BLOCK_DK if dq is not None else 1, dtype=torch.float32, device=q.device)
    if idx.n_items:
        _dkdv_kernel[(idx.n_items,)](
            q,
            k,
            v,
            do,
            lse,
            delta,
            idx.pair_row,
            idx.pair_lo,
            idx.pair_hi,
            idx.item_seg,
            idx.item_start,
            idx.item_end,
            idx.item_slot,
            dk,
            dv,
            pdk,
            pdv,
            idx.pair_slot,
            pdq,
            idx.n_tiles,
            d.S_kv,
            d.h,
            d.Dk,
            d.Dv,
            scale,
            qk_scale_log2,
            ROWS=max(1, cfg["block_m"] // heads_kv),
            BLOCK_H=heads_kv,
            BLOCK_N=bn,
            BLOCK_DK=BLOCK_DK,
            BLOCK_DV=BLOCK_DV,
            PRECISION=precision,
            DQ=dq is not None,
            num_warps=cfg["warps"],
            num_stages=cfg["stages"],
        )
    if idx.n_multi:
        _reduce_partials_kernel[(idx.n_multi,)](
            pdk,
            pdv,
            idx.multi_seg,
            idx.multi_slot,
            idx.multi_count,
            dk,
            dv,
            idx.n_tiles,
            d.S_kv,
            d.Dk,
            d.Dv,
            BLOCK_N=bn,
            BLOCK_DK=BLOCK_DK,
            BLOCK_DV=BLOCK_DV,
        )
    if dq is not None:
        _sum_dq_kernel[(d.B * d.S * d.G,)](
            pdq,
            idx.row_end,
            idx.row_pairs,
            dq,
            d.h,
            d.Dk,
            scale,
            BLOCK_H=heads_kv,
            BLOCK_DK=BLOCK_DK,
            num_warps=1 if heads_kv < 4 else 4,
        )
