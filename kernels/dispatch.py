"""The public entry point. The Triton/CUDA fallback ladder grows here (issue 4)."""
from __future__ import annotations

from selgate.reference.ranges import normalize_ranges
from selgate.reference.validation import check_inputs

from .sdpa import selection_attention_sdpa

BACKENDS = ("auto", "sdpa")


def selection_attention(q, k, v, ranges, *, scale=None, backend: str = "auto", return_lse: bool = False,
                        positions=None):
    """NSA selection attention (SPEC.md). Validates inputs, normalises ranges once and
    calls one backend; `auto` currently picks `sdpa`."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    d = check_inputs(q, k, v, ranges, scale=scale, positions=positions)
    norm = normalize_ranges(ranges, d.S_kv, positions)
    return selection_attention_sdpa(q, k, v, norm, scale=scale, positions=positions,
                                    return_lse=return_lse, normalized=True)
