"""Range normalisation, validation and expansion (SPEC.md, "Ranges").

All functions are vectorised over rows (no Python loop over (b, s, g)) and never
synchronise with the device except `validate_ranges`, which must read a verdict.
"""

from __future__ import annotations

import torch


def query_positions(B: int, S: int, S_kv: int, device, positions=None) -> torch.Tensor:
    """Absolute position `t` of every query, int64 [B, S]: `s + S_kv - S` unless given."""
    if positions is not None:
        return positions.to(torch.int64)
    t = torch.arange(S, device=device, dtype=torch.int64) + (S_kv - S)
    return t.expand(B, S)


def key_limit(ranges: torch.Tensor, S_kv: int, positions=None) -> torch.Tensor:
    """Exclusive key bound `min(t + 1, S_kv)` per row, int64 broadcastable to [B, S, 1, 1]."""
    B, S = ranges.shape[:2]
    t = query_positions(B, S, S_kv, ranges.device, positions)
    return (t + 1).clamp(min=0, max=S_kv)[:, :, None, None]


def normalize_ranges(ranges: torch.Tensor, S_kv: int, positions=None) -> torch.Tensor:
    """Clamp to `[0, min(t+1, S_kv))`, drop empty, sort by start, merge overlapping and
    adjacent ranges, pad with `(0, 0)`. Same shape and dtype as `ranges`; idempotent."""
    n = ranges.shape[3]
    lim = key_limit(ranges, S_kv, positions)
    r = ranges.to(torch.int64)
    start = torch.minimum(r[..., 0].clamp(min=0), lim)
    end = torch.minimum(r[..., 1].clamp(min=0), lim)
    valid = end > start
    big = torch.iinfo(torch.int64).max
    start = torch.where(valid, start, big)
    end = torch.where(valid, end, 0)
    start, order = torch.sort(start, dim=-1, stable=True)
    end = torch.gather(end, -1, order)
    valid = torch.gather(valid, -1, order)
    # A sorted range opens a new merged range when it starts after every earlier end.
    reach = torch.cummax(end, dim=-1).values
    prev_reach = torch.cat([torch.full_like(reach[..., :1], -1), reach[..., :-1]], dim=-1)
    opens = valid & (start > prev_reach)
    slot = torch.cumsum(opens.to(torch.int64), dim=-1) - 1
    slot = torch.where(valid, slot, n)  # invalid entries go to a discarded extra slot
    shape = (*ranges.shape[:3], n + 1)
    out_start = torch.full(shape, big, dtype=torch.int64, device=ranges.device)
    out_end = torch.zeros(shape, dtype=torch.int64, device=ranges.device)
    out_start = out_start.scatter_reduce(-1, slot, start, reduce="amin")
    out_end = out_end.scatter_reduce(-1, slot, end, reduce="amax")
    filled = out_end[..., :n] > 0
    out = torch.stack([torch.where(filled, out_start[..., :n], 0), torch.where(filled, out_end[..., :n], 0)], dim=-1)
    return out.to(ranges.dtype)


class RangeError(ValueError):
    """Ranges that break the producer contract (sorted, disjoint, in bounds)."""


def validate_ranges(ranges: torch.Tensor, S_kv: int, positions=None) -> None:
    """Debug-mode check of the producer contract: every non-empty range lies in
    `[0, min(t+1, S_kv))`, ranges are sorted by start and disjoint (empty entries,
    `end <= start`, are padding and may sit anywhere). Raises `RangeError` naming the
    first offending `(b, s, g, j)` and its values."""
    lim = key_limit(ranges, S_kv, positions)
    r = ranges.to(torch.int64)
    start, end = r[..., 0], r[..., 1]
    real = end > start
    out_of_bounds = real & ((start < 0) | (end > lim))
    # previous real range's end, carried over padding entries
    prev_end = torch.where(real, end, -1)
    prev_end = torch.cummax(prev_end, dim=-1).values
    prev_end = torch.cat([torch.full_like(prev_end[..., :1], -1), prev_end[..., :-1]], dim=-1)
    unsorted = real & (start < prev_end)
    idx = (out_of_bounds | unsorted).nonzero()
    if len(idx):
        b, s, g, j = (int(x) for x in idx[0])
        why = "outside [0, min(t+1, S_kv))" if out_of_bounds[b, s, g, j] else "overlaps or precedes an earlier range"
        raise RangeError(
            f"ranges[{b}, {s}, {g}, {j}] = ({int(start[b, s, g, j])}, {int(end[b, s, g, j])}) {why}; "
            f"row limit min(t+1, S_kv) = {int(lim[b, s, 0, 0])}, row = {r[b, s, g].tolist()}"
        )


def selected_keys(ranges: torch.Tensor, S_kv: int, positions=None) -> torch.Tensor:
    """[B, G, S_kv] bool: the keys that at least one row of (b, g) selects (after clamping
    and merging), in O(B * G * (S * n + S_kv)) memory: +1 at each range's start, -1 at its
    end, then a running sum. Tests and checks poison every other key with NaN."""
    r = normalize_ranges(ranges, S_kv, positions).to(torch.int64)
    B, S, G, n, _ = r.shape
    r = r.permute(0, 2, 1, 3, 4).reshape(B, G, S * n, 2)
    delta = torch.zeros(B, G, S_kv + 1, dtype=torch.int64, device=r.device)
    delta.scatter_add_(2, r[..., 0], torch.ones_like(r[..., 0]))
    delta.scatter_add_(2, r[..., 1], -torch.ones_like(r[..., 1]))
    return delta.cumsum(2)[..., :S_kv] > 0


def selected_lengths(norm_ranges: torch.Tensor) -> torch.Tensor:
    """Number of selected keys `L` per row [B, S, G] of normalised ranges."""
    r = norm_ranges.to(torch.int64)
    return (r[..., 1] - r[..., 0]).clamp(min=0).sum(-1)


def expand_ranges(norm_ranges: torch.Tensor, L_max: int):
    """Key index of every selected key of each row of normalised ranges.

    Returns `(idx, valid)`, both [..., L_max]: `idx` holds the keys in ascending order
    and, past the row's length, repeats its last key (0 for an empty row), so a padded
    gather reads only selected keys (NaN-safe); `valid` says which entries are real."""
    r = norm_ranges.to(torch.int64)
    start, length = r[..., 0], (r[..., 1] - r[..., 0]).clamp(min=0)
    ends = torch.cumsum(length, dim=-1)
    begins = ends - length
    p = torch.arange(L_max, device=r.device, dtype=torch.int64).expand(*r.shape[:-2], L_max).contiguous()
    j = torch.searchsorted(ends.contiguous(), p, right=True).clamp(max=r.shape[-2] - 1)
    valid = p < ends[..., -1:]
    idx = torch.gather(start, -1, j) + p - torch.gather(begins, -1, j)
    last = torch.gather(idx, -1, (ends[..., -1:] - 1).clamp(min=0, max=L_max - 1))
    return torch.where(valid, idx, torch.where(ends[..., -1:] > 0, last, 0)), valid
