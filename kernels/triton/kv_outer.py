"""Prefill forward with KV tiles outside: each selected KV tile is loaded once for all the query
rows that selected it, then each row merges its tiles' partial results.

Why: the row-outer forward (fwd.py, pairs.py) loads every row's selected keys again for each
row. At the 64k prefill shape (T=65536, 4 KV heads, 16 blocks of 64) that is ~137 GB through L2
a call whatever the number of query heads per KV head, so h = 1 costs what h = 16 costs. Here
the inverse index (inverse_index.py, the backward's dk/dv index) lists, for every (b, g, KV tile),
the (row, key interval) pairs that touch it; one program per work item loads its tile's K and V
once and walks its pairs ROWS at a time, all heads of each, as one MMA operand. For every pair it
writes the softmax partial of the pair's keys (running max m in log2 units, sum l, and the
unnormalised P.V) to the pair's row-major slot. A second kernel merges each row's partials in
slot order (online softmax rescaling). The order is fixed everywhere, so the result is bitwise
reproducible, with no atomics.

Cost: the partials, pairs x h x (Dv + 2) fp32 (2.2 GB at that shape for h = 1), written once and
read once; so the kernel pays off where few heads share a tile, and the profile routes by h.
Keys of a tile that no pair of the work item selects are never loaded (read as zeros: a NaN
there would spread through 0 * NaN in the P.V product); a NaN or inf in V at a key some pairs
select reaches those pairs' rows alone (`_special_values`), as in the row kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from selgate.reference.ranges import query_positions

from . import inverse_index
from .inverse_index import InverseIndex
from .tiles import keys_used, pow2_at_least, work_item

LOG2E = 1.4426950408889634
BLOCK_N = 64  # keys a tile: NSA's selection block
CHUNK = 1024  # pairs a work item: bounds the longest program (block 0 is selected by every row)
ROWS_X_HEADS = 64  # MMA rows a step: ROWS pairs x BLOCK_H heads


@triton.jit
def _partials_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pair_row_ptr,
    pair_lo_ptr,
    pair_hi_ptr,
    pair_slot_ptr,
    item_seg_ptr,
    item_start_ptr,
    item_end_ptr,
    pm_ptr,
    pl_ptr,
    pacc_ptr,
    n_tiles,
    S_kv,
    h,
    Dk,
    Dv,
    qk_scale_log2,
    ROWS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    bg, keys, p0, p1 = work_item(item_seg_ptr, item_start_ptr, item_end_ptr, n_tiles, BLOCK_N)
    km = (keys < S_kv) & keys_used(keys, pair_lo_ptr, pair_hi_ptr, p0, p1, 64)
    dks = tl.arange(0, BLOCK_DK)
    dvs = tl.arange(0, BLOCK_DV)
    kv_rows = bg * S_kv + keys
    kt = tl.load(k_ptr + kv_rows[:, None] * Dk + dks[None, :], mask=km[:, None] & (dks[None, :] < Dk), other=0.0)
    vt = tl.load(v_ptr + kv_rows[:, None] * Dv + dvs[None, :], mask=km[:, None] & (dvs[None, :] < Dv), other=0.0)
    # A row's zero weight times a NaN or inf in V at a key another row of the step selects would
    # spread it to that row through the MMA: the MMA takes V's finite part, and a tile holding a
    # non-finite value then sets each row's stored partial to the special values of the keys
    # that row selects alone.
    bad = (vt != vt) | (tl.abs(vt) == float("inf"))
    special = tl.max(tl.max(bad.to(tl.int32), 1), 0) > 0
    vt = tl.where(bad, tl.zeros_like(vt), vt)
    cols = tl.arange(0, ROWS * BLOCK_H)  # MMA row = (pair r, head i)
    head = cols % BLOCK_H
    for i in tl.range(p0, p1, ROWS):
        pidx = i + cols // BLOCK_H
        pm = pidx < p1
        cm = pm & (head < h)
        row = tl.load(pair_row_ptr + pidx, mask=pm, other=0).to(tl.int64)
        lo = tl.load(pair_lo_ptr + pidx, mask=pm, other=0)
        hi = tl.load(pair_hi_ptr + pidx, mask=pm, other=0)
        slot = tl.load(pair_slot_ptr + pidx, mask=pm, other=0).to(tl.int64)
        qg = tl.load(q_ptr + (row * h + head)[:, None] * Dk + dks[None, :], mask=cm[:, None] & (dks[None, :] < Dk), other=0.0)
        sel = (keys[None, :] >= lo[:, None]) & (keys[None, :] < hi[:, None]) & cm[:, None]
        s = tl.where(sel, tl.dot(qg, tl.trans(kt), input_precision=PRECISION) * qk_scale_log2, float("-inf"))
        m = tl.max(s, 1)
        m = tl.where(cm, m, 0.0)  # every pair holds a key; padded MMA rows hold none
        p = tl.where(sel, tl.exp2(s - m[:, None]), 0.0)
        acc = tl.dot(p.to(vt.dtype), vt, input_precision=PRECISION)
        out = slot * h + head
        tl.store(pm_ptr + out, m, mask=cm)
        tl.store(pl_ptr + out, tl.sum(p, 1), mask=cm)
        tl.store(pacc_ptr + out[:, None] * BLOCK_DV + dvs[None, :], acc, mask=cm[:, None])
    if special:  # rare: outside the pipelined loop, which a branch in it slowed 1.3-1.6x
        tl.debug_barrier()  # the partials this program stored, seen by all its threads
        raw = tl.load(v_ptr + kv_rows[:, None] * Dv + dvs[None, :], mask=km[:, None] & (dvs[None, :] < Dv), other=0.0)
        for i in tl.range(p0, p1, ROWS):
            pidx = i + cols // BLOCK_H
            pm = pidx < p1
            cm = pm & (head < h)
            lo = tl.load(pair_lo_ptr + pidx, mask=pm, other=0)
            hi = tl.load(pair_hi_ptr + pidx, mask=pm, other=0)
            slot = tl.load(pair_slot_ptr + pidx, mask=pm, other=0).to(tl.int64)
            sel = (keys[None, :] >= lo[:, None]) & (keys[None, :] < hi[:, None]) & cm[:, None]
            at = pacc_ptr + (slot * h + head)[:, None] * BLOCK_DV + dvs[None, :]
            tl.store(at, _special_values(tl.load(at, mask=cm[:, None], other=0.0), sel, raw), mask=cm[:, None])


@triton.jit
def _special_values(acc, sel, vt):
    """`acc` [rows, Dv] with the NaN and infinities of the V values `vt` each row selects (flags
    counted by MMA on 0/1 operands, exact), as a row kernel's p * v would give them."""
    w = sel.to(tl.float16)
    nan = tl.dot(w, (vt != vt).to(tl.float16)) > 0
    pos = tl.dot(w, (vt == float("inf")).to(tl.float16)) > 0
    neg = tl.dot(w, (vt == float("-inf")).to(tl.float16)) > 0
    inf = tl.where(pos, float("inf"), float("-inf"))
    return tl.where(nan | (pos & neg), float("nan"), tl.where(pos | neg, inf, acc))


@triton.jit
def _merge_kernel(
    pm_ptr,
    pl_ptr,
    pacc_ptr,
    row_end_ptr,
    row_pairs_ptr,
    o_ptr,
    lse_ptr,
    h,
    Dv,
    BLOCK_H: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    p1 = tl.load(row_end_ptr + row)
    p0 = p1 - tl.load(row_pairs_ptr + row)
    heads = tl.arange(0, BLOCK_H)
    hm = heads < h
    dvs = tl.arange(0, BLOCK_DV)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
    for j in tl.range(p0, p1):  # slot order: the row's ranges, then tiles, left to right
        at = j * h + heads
        m_j = tl.load(pm_ptr + at, mask=hm, other=0.0)
        m_new = tl.maximum(m_i, m_j)
        a = tl.exp2(m_i - m_new)
        b = tl.exp2(m_j - m_new)
        l_i = l_i * a + tl.load(pl_ptr + at, mask=hm, other=0.0) * b
        part = tl.load(pacc_ptr + at[:, None] * BLOCK_DV + dvs[None, :], mask=hm[:, None], other=0.0)
        acc = acc * a[:, None] + part * b[:, None]
        m_i = m_new
    empty = l_i == 0.0
    o = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, l_i)[:, None])
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    out = row * h + heads
    tl.store(o_ptr + out[:, None] * Dv + dvs[None, :], o.to(o_ptr.dtype.element_ty), mask=hm[:, None] & (dvs[None, :] < Dv))
    tl.store(lse_ptr + out, lse, mask=hm)


def kv_outer_forward(q, k, v, norm_ranges, *, scale: float, positions=None, out):
    """Writes `out` = `(o, lse)` as `fwd.triton_forward` would, for ranges already normalised
    (sorted, disjoint, clamped), and returns it. Copies q, k, v that are not contiguous. Extra
    memory: the inverse index and the partials, pairs x h x (pow2(Dv) + 2) fp32, about
    inverse_index.PARTIALS_BUDGET a launch at most: a call whose partials would take more runs
    in chunks of query rows (each chunk loads its tiles once)."""
    B, S, G, h, Dk = q.shape
    S_kv, Dv = k.shape[2], v.shape[3]
    o, lse = out
    if B * S * G == 0:
        return o, lse
    q, k, v = (t.contiguous() for t in (q, k, v))
    o_run, lse_run = (t if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format) for t in (o, lse))
    t = query_positions(B, S, S_kv, q.device, positions)
    per_pair = h * (pow2_at_least(Dv, 16) + 2) * 4
    for b, s in _row_chunks(norm_ranges, t, S_kv, inverse_index.PARTIALS_BUDGET // per_pair):
        _launch(q[b, s], k[b], v[b], norm_ranges[b, s], t[b, s], o_run[b, s], lse_run[b, s], scale=scale)
    if o_run is not o:
        o.copy_(o_run)
        lse.copy_(lse_run)
    return o, lse


def _row_chunks(ranges, t, S_kv: int, max_pairs: int) -> list:
    """[(batch slice, query-row slice)]: the whole call when its (row, tile) pairs fit
    `max_pairs` (one host read), else each batch's rows cut where the running pair count passes
    a multiple of `max_pairs` (a chunk passes it by at most one row's pairs; a row is never cut).
    Two more host reads then, and no Python loop over rows."""
    B, S = t.shape
    r = ranges.to(torch.int64)
    start = r[..., 0]
    end = torch.minimum(r[..., 1], (t + 1).clamp(0, S_kv)[:, :, None, None])
    tiles = torch.where(end > start, torch.div(end - 1, BLOCK_N, rounding_mode="floor") - start // BLOCK_N + 1, 0)
    cum = torch.cumsum(tiles.sum((2, 3)), 1)  # [B, S]: each batch's running pair count
    if int(cum[:, -1].sum()) <= max_pairs:
        return [(slice(None), slice(None))]
    k = int(cum[:, -1].max() - 1) // max_pairs + 1  # chunks of the fullest batch
    targets = (torch.arange(1, k, device=cum.device) * max_pairs).expand(B, k - 1).contiguous()
    cuts = torch.searchsorted(cum, targets, right=True).tolist()
    chunks = []
    for b, row in enumerate(cuts):
        bounds = sorted({0, S, *(c for c in row if 0 < c < S)})
        chunks += [(slice(b, b + 1), slice(s0, s1)) for s0, s1 in zip(bounds, bounds[1:])]
    return chunks


def _launch(q, k, v, norm_ranges, t, o, lse, *, scale: float) -> None:
    """Both kernels over one chunk of rows (all contiguous)."""
    B, S, G, h, Dk = q.shape
    S_kv, Dv = k.shape[2], v.shape[3]
    lim = (t + 1).clamp(0, S_kv)
    idx = InverseIndex(norm_ranges, lim, G, S_kv, BLOCK_N, CHUNK)
    BLOCK_H = pow2_at_least(h)
    BLOCK_DK, BLOCK_DV = pow2_at_least(Dk, 16), pow2_at_least(Dv, 16)
    slots = max(idx.n_pairs, 1) * h
    pm = torch.empty(slots, dtype=torch.float32, device=q.device)
    pl = torch.empty(slots, dtype=torch.float32, device=q.device)
    pacc = torch.empty(slots * BLOCK_DV, dtype=torch.float32, device=q.device)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    if idx.n_items:
        _partials_kernel[(idx.n_items,)](
            q,
            k,
            v,
            idx.pair_row,
            idx.pair_lo,
            idx.pair_hi,
            idx.pair_slot,
            idx.item_seg,
            idx.item_start,
            idx.item_end,
            pm,
            pl,
            pacc,
            idx.n_tiles,
            S_kv,
            h,
            Dk,
            Dv,
            scale * LOG2E,
            ROWS=max(1, ROWS_X_HEADS // BLOCK_H),
            BLOCK_H=BLOCK_H,
            BLOCK_N=BLOCK_N,
            BLOCK_DK=BLOCK_DK,
            BLOCK_DV=BLOCK_DV,
            PRECISION=precision,
            num_warps=4,
            num_stages=2,
        )
    warps = max(1, min(4, BLOCK_H * BLOCK_DV // 512))  # one warp a row at h = 1: 128 lanes of work, not 4 warps idle
    _merge_kernel[(B * S * G,)](
        pm, pl, pacc, idx.row_end, idx.row_pairs, o, lse, h, Dv, BLOCK_H=BLOCK_H, BLOCK_DV=BLOCK_DV, num_warps=warps
    )
