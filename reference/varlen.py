"""Varlen (packed sequences with `cu_seqlens`, as in FlashAttention).

A varlen call is the batched contract applied per sequence. It maps onto one batched
call with `B = 1`: sequence-local ranges are clamped to the sequence's own causal limit,
shifted by the sequence's key offset, and each query gets its absolute position. Packed
layouts: `q` [1, T_q, G, h, Dk], `k`/`v` [1, G, T_kv, D], local `ranges` [1, T_q, G, n, 2].
"""

from __future__ import annotations

import torch

from .ranges import normalize_ranges


def pack_sequences(seqs, dim: int = 0):
    """Concatenate tensors along `dim`; return `(packed, cu_seqlens)` with int32 offsets."""
    lens = torch.tensor([0] + [s.shape[dim] for s in seqs], dtype=torch.int64)
    cu = torch.cumsum(lens, 0).to(torch.int32)
    return torch.cat(list(seqs), dim=dim), cu.to(seqs[0].device)


def unpack_sequences(packed: torch.Tensor, cu_seqlens: torch.Tensor, dim: int = 0):
    """Inverse of `pack_sequences`: the list of per-sequence slices along `dim`."""
    cu = cu_seqlens.tolist()
    return [packed.narrow(dim, a, b - a) for a, b in zip(cu[:-1], cu[1:])]


def _need_cu_tensor(name: str, cu) -> None:
    if not isinstance(cu, torch.Tensor) or cu.is_meta:
        got = f"a meta tensor {tuple(cu.shape)}" if isinstance(cu, torch.Tensor) else type(cu).__name__
        raise TypeError(f"{name}: expected a 1-D int32/int64 torch.Tensor of offsets, got {got}")


def _check_cu(name: str, cu: torch.Tensor, total: int) -> None:
    if cu.dim() != 1 or cu.numel() < 2 or cu.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: expected a 1-D int32/int64 tensor of >= 2 offsets, got {cu.dtype} {tuple(cu.shape)}")
    if int(cu[0]) != 0 or int(cu[-1]) != total or bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"{name}: expected non-decreasing offsets from 0 to {total}, got {cu.tolist()}")


def varlen_to_batched(ranges: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, T_kv: int | None = None):
    """Map sequence-local ranges [1, T_q, G, n, 2] to global ranges and positions [1, T_q].

    Within sequence i, query `s` sits at `t = s + len_k(i) - len_q(i)` (SPEC.md). `T_kv`
    (the packed keys' length) is checked against `cu_seqlens_k[-1]` when given. Global
    ranges keep the dtype of `ranges`, int64 where T_kv passes int32."""
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        _need_cu_tensor(name, cu)
    T_q = ranges.shape[1]
    _check_cu("cu_seqlens_q", cu_seqlens_q, T_q)
    if cu_seqlens_k.shape != cu_seqlens_q.shape:
        raise ValueError(
            f"cu_seqlens_k: expected shape {tuple(cu_seqlens_q.shape)} like cu_seqlens_q, got {tuple(cu_seqlens_k.shape)}"
        )
    T_kv = int(cu_seqlens_k[-1]) if T_kv is None else T_kv
    _check_cu("cu_seqlens_k", cu_seqlens_k, T_kv)
    cu_q = cu_seqlens_q.to(torch.int64)
    cu_k = cu_seqlens_k.to(torch.int64)
    row = torch.arange(T_q, device=ranges.device)
    seq = torch.searchsorted(cu_q[1:].contiguous(), row, right=True)
    len_q = (cu_q[1:] - cu_q[:-1])[seq]
    len_k = (cu_k[1:] - cu_k[:-1])[seq]
    t_local = (row - cu_q[seq]) + len_k - len_q
    local = normalize_ranges(ranges, T_kv, t_local[None]).to(torch.int64)
    shift = cu_k[seq][None, :, None, None, None]
    real = local[..., 1:2] > local[..., 0:1]
    # int32 ranges stay int32 unless a packed key offset passes it (they would wrap)
    dtype = ranges.dtype if T_kv <= torch.iinfo(torch.int32).max else torch.int64
    glob = torch.where(real, local + shift, 0).to(dtype)
    return glob, (t_local + cu_k[seq])[None]
