"""Triton selection attention. Importing this package imports triton; the dispatcher
imports it lazily, only when the Triton rung is tried."""
from __future__ import annotations

import torch

from selgate.kernels.errors import BackendUnavailable
from selgate.kernels.policy import capability, settings, triton_unsupported
from selgate.reference.ranges import normalize_ranges
from selgate.reference.validation import check_inputs, resolve_scale

from .fwd import triton_forward


def selection_attention_triton(q, k, v, ranges, *, scale=None, positions=None, return_lse=False,
                               normalized: bool = False):
    """Selection attention on the Triton kernel; strict: raises `BackendUnavailable` with a
    reason code instead of falling back. `normalized=True` skips range normalisation when
    the caller (the dispatcher) already did it. The single function the dispatcher calls
    for the Triton rung. Forward only: inputs that require grad are refused ("grad")."""
    d = check_inputs(q, k, v, ranges, scale=scale, positions=positions)
    why = triton_unsupported(q, d.Dk, d.Dv, capability(q.device), settings())
    if why is not None:
        raise BackendUnavailable(*why)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise BackendUnavailable("grad", "the Triton backward is not wired into this entry point")
    norm = ranges if normalized else normalize_ranges(ranges, d.S_kv, positions)
    o, lse = triton_forward(q, k, v, norm, scale=resolve_scale(scale, d.Dk), positions=positions)
    return (o, lse) if return_lse else o


__all__ = ["selection_attention_triton", "triton_forward"]
