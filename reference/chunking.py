"""Row-chunked evaluation under a memory budget, shared by the reference and the sdpa path.

Gathered K/V are the memory hog of gather-based attention. Evaluating rows in chunks
bounds them in forward; checkpointing each chunk under autograd bounds them in backward
too (each chunk's gather is recomputed when its gradient is needed)."""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def rows_per_chunk(bytes_per_row: int, budget_bytes: int) -> int:
    """How many rows fit in `budget_bytes` (at least one)."""
    return max(1, int(budget_bytes) // max(int(bytes_per_row), 1))


def run_chunked(fn, row_args, chunk: int, *, const_args=()):
    """Call `fn(*row_chunk, *const_args)` on consecutive `chunk`-row slices of every tensor
    in `row_args` (split on dim 0) and concatenate each of its outputs along dim 0."""
    n = row_args[0].shape[0]
    grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (*row_args, *const_args))
    pieces = []
    for i in range(0, n, chunk):
        args = (*(t[i : i + chunk] for t in row_args), *const_args)
        pieces.append(checkpoint(fn, *args, use_reentrant=False) if grad else fn(*args))
    return tuple(torch.cat(parts) for parts in zip(*pieces))
