"""NaN left in the CUDA caching allocator before a call, so unwritten outputs show up
(every family's evaluation does it, `conformance/evaluation.py`)."""

from __future__ import annotations

import torch


def poison_cuda_cache(q, k, v) -> None:
    """Leave NaN (all-ones bytes) in CUDA caching-allocator blocks of the sizes o, lse, dq,
    dk and dv take, so that an output element a kernel never writes most likely reads as
    NaN. Not a guarantee: freed neighbours in one segment merge, and a call's own
    temporaries may take such a block first."""
    if not q.is_cuda:
        return
    rows = q.numel() // q.shape[-1]
    sizes = (rows * v.shape[-1] * v.element_size(), rows * 4, *(t.numel() * t.element_size() for t in (q, k, v)))
    blocks = [torch.empty(n, dtype=torch.uint8, device=q.device).fill_(255) for n in sizes]
    del blocks
