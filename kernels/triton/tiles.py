"""Where a row's selected keys lie, one tile at a time: shared by the forward and the dq kernel
(and the host's tile arithmetic: `pow2_at_least`, `ceil_div`, what fits shared memory).

A row's ranges, clamped and concatenated, number its selected keys by position: position
`p` in `[first[j], stop[j])` is key `start[j] + p - first[j]`. Loops over positions instead
of over ranges stay flat across range boundaries, so the software pipeliner can prefetch the
next tile (NSA ranges are mostly one 64-key block: a per-range inner loop would run once).
"""

import triton
import triton.language as tl

MIN_DOT = 16  # tl.dot needs every dimension >= 16


def pow2_at_least(x: int, lo: int = 1) -> int:
    """The smallest power of two >= max(x, lo): a tile's padded extent, on the host. Plain
    arithmetic: `triton.next_power_of_2` goes through Triton's constexpr-function call, about
    10 us a call on the 2-core CPU machine, four of them on every forward launch."""
    return max(lo, 1 << (int(x) - 1).bit_length())


def ceil_div(a: int, b: int) -> int:
    """`triton.cdiv` in plain arithmetic, for the host (the same constexpr-function cost)."""
    return -(-int(a) // int(b))


@triton.jit
def gather_keys(p0, start, first, stop, L, lim, TILE: tl.constexpr):
    """Keys (int64) at positions [p0, p0 + TILE) and their mask: positions past `L` and keys
    at or past `lim` (the causal limit) are masked."""
    p = p0 + tl.arange(0, TILE)
    in_range = (p[:, None] >= first[None, :]) & (p[:, None] < stop[None, :])
    key = tl.sum(tl.where(in_range, start[None, :] + p[:, None] - first[None, :], 0), 1)
    return key.to(tl.int64), (p < L) & (key < lim)


@triton.jit
def block_key(i, j, start, nfull, cum, BLOCK: tl.constexpr):
    """First key of the row's whole tile `i`, counting the `nfull` whole BLOCK-key tiles of
    every range in order (`cum`: their running sum; `j`: range indices)."""
    jj = tl.sum((cum <= i).to(tl.int32), 0)
    return tl.sum(tl.where(j == jj, start + (i - cum + nfull) * BLOCK, 0), 0)


def smem_fits(block_l: int, stages: int, dk_pad: int, dv_pad: int, item: int, budget_kb: int) -> bool:
    """Whether the pipelined K/V tiles of one program fit `budget_kb` of shared memory."""
    return block_l * (dk_pad + dv_pad) * item * max(stages, 1) <= budget_kb * 1024


def fit_smem(cfg: dict, Dk: int, Dv: int, item: int, budget_kb: int) -> dict:
    """Shrink the stage count, then BLOCK_L, until the K/V tiles fit `budget_kb`."""
    dk_pad, dv_pad = (pow2_at_least(d, MIN_DOT) for d in (Dk, Dv))
    block_l, stages = int(cfg["BLOCK_L"]), int(cfg["num_stages"])
    while block_l > MIN_DOT and not smem_fits(block_l, stages, dk_pad, dv_pad, item, budget_kb):
        if stages > 2:
            stages -= 1
        else:
            block_l //= 2
    return {"BLOCK_L": block_l, "num_warps": int(cfg["num_warps"]), "num_stages": stages}


@triton.jit
def keys_used(keys, pair_lo_ptr, pair_hi_ptr, p0, p1, VEC: tl.constexpr):
    """Which of a KV tile's `keys` at least one of the work item's pairs [p0, p1) selects: the
    keys a KV-outer kernel loads (the rest may hold NaN, and a 0 * NaN in an MMA would spread it)."""
    used = tl.zeros(keys.shape, tl.int32)
    for i in tl.range(p0, p1, VEC):
        pidx = i + tl.arange(0, VEC)
        pm = pidx < p1
        lo = tl.load(pair_lo_ptr + pidx, mask=pm, other=0)
        hi = tl.load(pair_hi_ptr + pidx, mask=pm, other=0)
        inside = (keys[None, :] >= lo[:, None]) & (keys[None, :] < hi[:, None])
        used = tl.maximum(used, tl.max(inside.to(tl.int32), 0))
    return used > 0


@triton.jit
def work_item(item_seg_ptr, item_start_ptr, item_end_ptr, n_tiles, BLOCK_N: tl.constexpr):
    """This program's work item of the inverse index (inverse_index.py): its (b, g) segment,
    the keys of its KV tile, and its pairs [p0, p1)."""
    w = tl.program_id(0)
    seg = tl.load(item_seg_ptr + w).to(tl.int64)
    p0 = tl.load(item_start_ptr + w).to(tl.int64)
    p1 = tl.load(item_end_ptr + w).to(tl.int64)
    return seg // n_tiles, (seg % n_tiles) * BLOCK_N + tl.arange(0, BLOCK_N), p0, p1
