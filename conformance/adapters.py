"""Adapters between the matrix's token ranges and the block-index form that NSA kernels
in the wild take, so such a kernel runs through the conformance matrix and the benchmarks
unchanged.

Two layouts are covered:
- padded (fla-core's `parallel_nsa`): q [B, T, HQ, Dk], k/v [B, T_kv, H, D],
  `block_indices` [B, T, H, S] int32 padded with -1, `block_counts` [B, T, H];
  packed sequences as `cu_seqlens` with B = 1.
- varlen (native-sparse-attention-triton's `topk_sparse_attention`): q [total, HQ, Dk],
  k/v [total, H, D], `topk_idx` [H, total, S] padded with -1, one `cu_seqlens` for
  queries and keys alike.

A block id `b` selects keys `[b * block_size, (b + 1) * block_size)`, cut at the query's
position `t` by the kernel's causal mask: exactly a block-aligned range clamped to `t + 1`.
Queries are the last T of T_kv keys (SPEC.md); a kernel that needs as many queries as keys
(`full_queries=True`, and every varlen-layout kernel) gets the earlier positions as extra
zero queries whose outputs are dropped. They select keys a real row selects (`_filler`), so
that they cannot fail a case the kernel would pass on the real queries alone.
"""

from __future__ import annotations

import torch

from selgate.reference import check_inputs, normalize_ranges, query_positions, varlen_to_batched


def _rows_to_blocks(norm: torch.Tensor, lim: torch.Tensor, block_size: int):
    """Block ids [..., S_max] (-1 padded, ascending) and counts [...] of normalised ranges
    [..., n, 2] whose row limits (t + 1, clamped to S_kv) are `lim` [...]."""
    start, end = norm[..., 0], norm[..., 1]
    valid = end > start
    aligned = (start % block_size == 0) & ((end % block_size == 0) | (end == lim[..., None]))
    bad = valid & ~aligned
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"ranges: row {idx[:-1]} range {idx[-1]} is [{int(start[idx])}, {int(end[idx])}), not "
            f"whole blocks of block_size={block_size} (ends may stop at t + 1 = {int(lim[idx[:-1]])})"
        )
    first = torch.div(start, block_size, rounding_mode="floor")
    count = torch.where(valid, torch.div(end - start + block_size - 1, block_size, rounding_mode="floor"), 0)
    counts = count.sum(-1)
    s_max = _power_of_two(int(counts.max()) if counts.numel() else 0)
    flat_first, flat_count = first.reshape(-1), count.reshape(-1)
    n = norm.shape[-2]
    row = torch.arange(flat_count.numel(), device=norm.device) // n
    rep_row = torch.repeat_interleave(row, flat_count)
    rep_first = torch.repeat_interleave(flat_first, flat_count)
    # position of each block within its row: running count minus the row's offset
    pos = torch.arange(rep_row.numel(), device=norm.device)
    row_start = torch.cumsum(counts.reshape(-1), 0) - counts.reshape(-1)
    within = pos - row_start[rep_row]
    run_start = torch.repeat_interleave(torch.cumsum(flat_count, 0) - flat_count, flat_count)
    ids = rep_first + (pos - run_start)
    out = torch.full((counts.numel(), s_max), -1, dtype=torch.int64, device=norm.device)
    out[rep_row, within] = ids
    return out.reshape(*counts.shape, s_max).to(torch.int32), counts.to(torch.int32)


def _power_of_two(n: int) -> int:
    """The slot count S of a block-index tensor: at least n, a power of two, as NSA's top-n
    counts are and as Triton kernels that `tl.arange(0, S)` over the slots need."""
    return 1 << max(n - 1, 0).bit_length()


def ranges_to_block_indices(ranges: torch.Tensor, block_size: int, S_kv: int, *, positions=None):
    """`(block_indices [B, S, G, S_max] int32, -1 padded, ascending, S_max a power of two;
    block_counts [B, S, G] int32)` of token ranges [B, S, G, n, 2], after the contract's normalisation (clamp to
    `t + 1`, merge). ValueError when a selection is not whole blocks of `block_size`."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size: expected an integer >= 1, got {block_size!r}")
    if not isinstance(ranges, torch.Tensor) or ranges.dim() != 5 or ranges.shape[-1] != 2:
        raise ValueError(
            f"ranges: expected a [B, S, G, n, 2] tensor, got "
            f"{tuple(ranges.shape) if isinstance(ranges, torch.Tensor) else type(ranges).__name__}"
        )
    B, S = ranges.shape[:2]
    norm = normalize_ranges(ranges, S_kv, positions).to(torch.int64)
    t = query_positions(B, S, S_kv, ranges.device, positions)
    lim = torch.clamp(t + 1, max=S_kv)[:, :, None].expand(ranges.shape[:3])
    return _rows_to_blocks(norm, lim, block_size)


def block_indices_to_ranges(block_indices: torch.Tensor, block_size: int, *, block_counts=None) -> torch.Tensor:
    """Token ranges [..., S, 2] int64 of block ids [..., S]: `(b * bs, (b + 1) * bs)` for each
    id >= 0 within its row's count, `(0, 0)` padding otherwise. The inverse of
    `ranges_to_block_indices` up to the clamp at `t + 1`, which normalisation restores."""
    ids = block_indices.to(torch.int64)
    keep = ids >= 0
    if block_counts is not None:
        counts = torch.as_tensor(block_counts, device=ids.device)
        keep &= torch.arange(ids.shape[-1], device=ids.device) < counts.to(torch.int64)[..., None]
    start = torch.where(keep, ids * block_size, 0)
    return torch.stack([start, torch.where(keep, start + block_size, 0)], -1)


def _dense(*tensors):
    """Contiguous tensors: kernels in the wild compute addresses from their shapes."""
    return tuple(t.contiguous() for t in tensors)


def _scale(scale, Dk):
    return float(Dk) ** -0.5 if scale is None else scale


def _filler(ranges, S_kv: int, pad: int, block_size: int) -> torch.Tensor:
    """Ranges [B, pad, G, 1, 2] of the `pad` queries a kernel needs ahead of the real ones
    (positions 0 .. pad - 1). An empty row is where kernels in the wild divide 0 by 0, and
    such a NaN reaches other rows' gradients through the backward's shared terms (0 * NaN), so
    each filler row selects keys instead: the first block a real row of its (batch, group)
    selects, cut at the filler's own position. Those keys are finite in every family (a real
    row reads them) and the filler's output gradient is zero, so its terms in dk and dv are
    exactly zero. A filler before every selected block selects nothing: any key it could read
    is one no real row selects."""
    norm = normalize_ranges(ranges, S_kv).to(torch.int64)
    start, end = norm[..., 0], norm[..., 1]
    first = torch.where(end > start, start, S_kv).amin(dim=(1, 3))  # [B, G]
    p = torch.arange(pad, device=ranges.device)[None, :, None]
    lo = first[:, None, :].expand(-1, pad, -1)
    hi = torch.minimum(lo + block_size, p + 1)
    keep = hi > lo
    return torch.stack([torch.where(keep, lo, 0), torch.where(keep, hi, 0)], -1)[..., None, :].to(ranges.dtype)


def _full_rows(q, ranges, S_kv, block_size):
    """q and ranges with S_kv - S leading zero queries (`_filler` says what they select)."""
    B, S = q.shape[:2]
    pad = S_kv - S
    if pad == 0:
        return q, ranges
    q = torch.cat([q.new_zeros((B, pad, *q.shape[2:])), q], 1)
    fill = _filler(ranges, S_kv, pad, block_size)
    first = torch.zeros((B, pad, *ranges.shape[2:]), dtype=ranges.dtype, device=ranges.device)
    first[..., :1, :] = fill
    return q, torch.cat([first, ranges], 1)


def _unpad_varlen(q, ranges, cu_q, cu_k, block_size):
    """Per-sequence padding of packed queries to their key count: (q, ranges, rows) where
    `rows` holds the padded positions of the original queries (fillers as `_full_rows`)."""
    starts_q, starts_k = cu_q.tolist(), cu_k.tolist()
    total = starts_k[-1]
    q_full = q.new_zeros((q.shape[0], total, *q.shape[2:]))
    r_full = torch.zeros((1, total, *ranges.shape[2:]), dtype=ranges.dtype, device=ranges.device)
    rows = []
    for qb, qe, kb, ke in zip(starts_q[:-1], starts_q[1:], starts_k[:-1], starts_k[1:]):
        pad = (ke - kb) - (qe - qb)
        rows.append(torch.arange(kb + pad, ke))
        if pad:
            r_full[:, kb : kb + pad, :, :1] = _filler(ranges[:, qb:qe], ke - kb, pad, block_size)
    rows = torch.cat(rows).to(q.device)
    return q_full.index_copy(1, rows, q), r_full.index_copy(1, rows, ranges), rows


def _check_varlen(q, k, v, ranges, cu_q, cu_k, scale):
    """The contract's checks of a packed call (shapes, dtypes, cu_seqlens), before any
    translation can fail with a message that names none of the arguments."""
    check_inputs(q, k, v, ranges, scale=scale)
    varlen_to_batched(ranges, cu_q, cu_k, k.shape[2])


def _varlen_blocks(ranges, cu_q, cu_k, block_size):
    """Block ids [1, T, G, S_max] and counts of local per-sequence ranges (packed)."""
    starts_q, starts_k = cu_q.tolist(), cu_k.tolist()
    ids, counts = [], []
    for qb, qe, kb, ke in zip(starts_q[:-1], starts_q[1:], starts_k[:-1], starts_k[1:]):
        i, c = ranges_to_block_indices(ranges[:, qb:qe], block_size, ke - kb)
        ids.append(i)
        counts.append(c)
    s_max = _power_of_two(max(i.shape[-1] for i in ids))
    ids = [torch.nn.functional.pad(i, (0, s_max - i.shape[-1]), value=-1) for i in ids]
    return torch.cat(ids, 1), torch.cat(counts, 1)


def padded_block_kernel(fn, block_size: int, *, full_queries: bool = False):
    """A matrix implementation `(q, k, v, ranges, *, scale=None) -> o` (with `.varlen`) of a
    kernel in the padded block-index layout, called as
    `fn(q, k, v, block_indices=, block_counts=, block_size=, scale=[, cu_seqlens=])`.
    `full_queries`: the kernel needs as many queries as keys (see the module docstring)."""

    def call(q, k, v, ranges, *, scale=None):
        dims = check_inputs(q, k, v, ranges, scale=scale)
        B, S, G, h, Dk = q.shape
        S_kv = k.shape[2]
        if full_queries:
            q, ranges = _full_rows(q, ranges, S_kv, block_size)
        ids, counts = ranges_to_block_indices(ranges, block_size, S_kv)
        o = fn(
            *_dense(q.flatten(2, 3), k.transpose(1, 2), v.transpose(1, 2)),
            block_indices=ids,
            block_counts=counts,
            block_size=block_size,
            scale=_scale(scale, dims.Dk),
        )
        return o.unflatten(2, (G, h))[:, -S:]

    def varlen(q, k, v, ranges, cu_seqlens_q, cu_seqlens_k, *, scale=None):
        _check_varlen(q, k, v, ranges, cu_seqlens_q, cu_seqlens_k, scale)
        G, h = q.shape[2:4]
        rows = None
        if full_queries:
            q, ranges, rows = _unpad_varlen(q, ranges, cu_seqlens_q, cu_seqlens_k, block_size)
            cu_seqlens_q = cu_seqlens_k
        ids, counts = _varlen_blocks(ranges, cu_seqlens_q, cu_seqlens_k, block_size)
        same = torch.equal(cu_seqlens_q, cu_seqlens_k)
        o = fn(
            *_dense(q.flatten(2, 3), k.transpose(1, 2), v.transpose(1, 2)),
            block_indices=ids,
            block_counts=counts,
            block_size=block_size,
            scale=_scale(scale, q.shape[-1]),
            cu_seqlens=cu_seqlens_k.long() if same else (cu_seqlens_q.long(), cu_seqlens_k.long()),
        )
        o = o.unflatten(2, (G, h))
        return o if rows is None else o.index_select(1, rows)

    call.block_size = block_size
    call.varlen = varlen
    return call


def varlen_block_kernel(fn, block_size: int):
    """A matrix implementation (with `.varlen`) of a kernel in the varlen block-index layout,
    called as `fn(q, k, v, topk_idx, block_size, cu_seqlens, scale)`: every batch row or
    packed sequence is one sequence of `cu_seqlens`, queries padded to their keys."""

    def run(q, k, v, ranges, cu, rows, scale):
        """q [1, T, G, h, Dk] and ranges padded to the keys; k/v [1, G, T, D]."""
        G, h = q.shape[2:4]
        ids, _ = _varlen_blocks(ranges, cu, cu, block_size)
        topk = ids[0].permute(1, 0, 2).contiguous()  # [G, T, S]
        o = fn(
            *_dense(q[0].flatten(1, 2), k[0].transpose(0, 1), v[0].transpose(0, 1)),
            topk,
            block_size,
            cu.to(torch.int32),
            _scale(scale, q.shape[-1]),
        )
        return o.unflatten(1, (G, h))[None].index_select(1, rows)

    def call(q, k, v, ranges, *, scale=None):
        check_inputs(q, k, v, ranges, scale=scale)
        B, S, G, h, Dk = q.shape
        S_kv = k.shape[2]
        qf, rf = _full_rows(q, ranges, S_kv, block_size)
        cu = torch.arange(0, (B + 1) * S_kv, S_kv, device=q.device)
        rows = (torch.arange(B, device=q.device)[:, None] * S_kv + torch.arange(S_kv - S, S_kv, device=q.device)).flatten()
        q1 = qf.reshape(1, B * S_kv, G, h, Dk)
        r1 = rf.reshape(1, B * S_kv, *rf.shape[2:])
        k1 = k.transpose(0, 1).reshape(G, B * S_kv, -1)[None]
        v1 = v.transpose(0, 1).reshape(G, B * S_kv, -1)[None]
        o = run(q1, k1, v1, r1, cu, rows, scale)
        return o.reshape(B, S, G, h, -1)

    def varlen(q, k, v, ranges, cu_seqlens_q, cu_seqlens_k, *, scale=None):
        _check_varlen(q, k, v, ranges, cu_seqlens_q, cu_seqlens_k, scale)
        qf, rf, rows = _unpad_varlen(q, ranges, cu_seqlens_q, cu_seqlens_k, block_size)
        return run(qf, k, v, rf, cu_seqlens_k, rows, scale)

    call.block_size = block_size
    call.varlen = varlen
    return call
