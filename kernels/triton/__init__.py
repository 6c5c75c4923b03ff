"""Triton selection attention. Importing this package imports triton; the dispatcher
imports it lazily, only when the Triton rung is tried."""

from __future__ import annotations

import torch

from selgate.errors import BackendUnavailable
from selgate.kernels import triton_limits
from selgate.kernels.policy import capability, dispatch_policy, interpreting, triton_unsupported
from selgate.reference.ranges import normalize_ranges
from selgate.reference.validation import check_inputs, resolve_scale

from . import interpreter_scalars, tuning
from .autograd import selection_attention_triton_autograd
from .fwd import INT32_MAX, launch_config, pair_kernel, tma_unsupported, triton_forward

interpreter_scalars.apply()
FORWARD_KERNELS = ("gather", "tma", "pairs", "kv_outer")


def selection_attention_triton(q, k, v, ranges, *, scale=None, positions=None, return_lse=False, normalized: bool = False):
    """Selection attention on the Triton kernel; strict: raises `BackendUnavailable` with a
    reason code instead of falling back. `normalized=True` skips range normalisation when
    the caller already did it. Inputs that require grad run the autograd Function of
    `autograd.py` (Triton backward) unless SELGATE_TRITON_ALLOW_GRAD=0, which refuses them ("grad")."""
    d = check_inputs(q, k, v, ranges, scale=scale, positions=positions)
    st = dispatch_policy()
    why = triton_unsupported(q, d.Dk, d.Dv, capability(q.device), st)
    if why is not None:
        raise BackendUnavailable(*why)
    norm = ranges if normalized else normalize_ranges(ranges, d.S_kv, positions)
    o, lse = run_triton(q, k, v, norm, scale=resolve_scale(scale, d.Dk), positions=positions, allow_grad=st.allow_grad)
    return (o, lse) if return_lse else o


def run_triton(q, k, v, norm, *, scale: float, positions, allow_grad: bool):
    """`(o, lse)` on inputs the caller has checked and ranges it has normalised: the one
    call the dispatcher's Triton rung makes, so a decode step pays for its checks once."""
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if grad and not allow_grad:
        raise BackendUnavailable("grad", "inputs require grad and SELGATE_TRITON_ALLOW_GRAD is off")
    if grad and k.shape[2] > INT32_MAX:
        raise BackendUnavailable("S_kv", f"k: S_kv={k.shape[2]} > 2^31 - 1; the Triton backward counts keys in int32")
    run = selection_attention_triton_autograd if grad else triton_forward
    return run(q, k, v, norm, scale=scale, positions=positions)


def forward_kernel_unsupported(kernel: str, q, k, v, positions=None) -> str | None:
    """Why the forward kernel `kernel` (FORWARD_KERNELS) cannot take this call, or None."""
    if kernel == "tma":
        return tma_unsupported(k, v)
    if kernel == "pairs":
        pairs = pair_kernel()
        return "this triton has no Gluon" if pairs is None else pairs.unsupported(q, k, v, positions)
    if kernel == "kv_outer":
        if q.shape[1] == 1:
            return "decode (S = 1): the KV-outer forward serves prefill"
        from .normalize import MAX_S_KV

        why = f"k: S_kv={k.shape[2]} > 2^30, past the packed sort key of the normalisation the route runs"
        return why if k.shape[2] > MAX_S_KV else None
    if kernel != "gather":
        raise ValueError(f"kernel: expected one of {FORWARD_KERNELS}, got {kernel!r}")
    return None


def selection_attention_kernel(
    kernel: str, q, k, v, ranges, *, scale=None, positions=None, return_lse=False, normalized: bool = False
):
    """One named forward kernel (FORWARD_KERNELS), whatever the profile would
    choose: the conformance matrix checks each kernel on its own this way. Strict: raises
    `BackendUnavailable` when that kernel cannot take the call, never runs another. Forward
    only (no autograd); the launch parameters are the profile's for the call's kind.
    `normalized=True` skips range normalisation, as in `selection_attention_triton`."""
    d = check_inputs(q, k, v, ranges, scale=scale, positions=positions)
    why = triton_limits.unsupported(q, d.Dk, d.Dv, interpreting())
    if why is not None:
        raise BackendUnavailable(*why)
    detail = forward_kernel_unsupported(kernel, q, k, v, positions)
    if detail is not None:
        raise BackendUnavailable(kernel, detail)
    cfg = launch_config(d.Dk, d.Dv, q.element_size(), tuning.kind_of(q.device, d.S))
    kv_outer = q.shape[3] if kernel == "kv_outer" else 0  # the call's h: the KV-outer route takes it, at any size
    cfg = {**cfg, "TMA": kernel == "tma", "PAIRS": kernel == "pairs", "KV_OUTER_MAX_HEADS": kv_outer, "KV_OUTER_MIN_TOKENS": {}}
    norm = ranges if normalized else normalize_ranges(ranges, d.S_kv, positions)
    o, lse = triton_forward(q, k, v, norm, scale=resolve_scale(scale, d.Dk), positions=positions, config=cfg)
    return (o, lse) if return_lse else o


__all__ = [
    "FORWARD_KERNELS",
    "forward_kernel_unsupported",
    "run_triton",
    "selection_attention_kernel",
    "selection_attention_triton",
    "triton_forward",
]
