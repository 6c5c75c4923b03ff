"""Selection attention as a torch op (`torch.ops.selgate.selection_attention`): what
`torch.compile` traces instead of the dispatcher's Python, so a model that calls
`selection_attention` compiles with `fullgraph=True`, forward and backward.

The op runs the same dispatcher as an eager call (same ladder, same settings, read when the
op runs), and its fake implementation gives the output shapes from the input shapes alone.
Its backward is a second op that gives the eager path's gradients. On a CUDA device that is
the Triton forward and backward called directly, as the eager autograd Function calls them. On
the CPU the call is recomputed with autograd on in a worker thread: an op's implementation runs
with autograd's dispatch keys excluded for its thread, and a fresh thread starts with them on
(on CUDA that hand-off would deadlock: autograd's device thread would wait on itself). The cost
is one extra forward per backward (docs/design/dispatcher.md)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import torch

from selgate.reference.varlen import varlen_to_batched

from .dispatch import eager_selection_attention

_grads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="selgate-op-backward")


def _lse_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.promote_types(q.dtype, torch.float32)


@torch.library.custom_op("selgate::selection_attention", mutates_args=())
def selection_attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ranges: torch.Tensor,
    positions: Optional[torch.Tensor],
    scale: Optional[float],
    backend: str,
    strict: Optional[bool],
    normalized: bool,
    return_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(o, lse)`; `lse` is an empty tensor unless `return_lse` (the sdpa path is faster without it)."""
    out = eager_selection_attention(q, k, v, ranges, positions, scale, backend, strict, normalized, return_lse)
    return out if return_lse else (out, q.new_empty(0, dtype=_lse_dtype(q)))


@selection_attention_op.register_fake
def _(q, k, v, ranges, positions, scale, backend, strict, normalized, return_lse):
    B, S, G, h, _ = q.shape
    lse_shape = (B, S, G, h) if return_lse else (0,)
    return q.new_empty((B, S, G, h, v.shape[-1]), dtype=v.dtype), q.new_empty(lse_shape, dtype=_lse_dtype(q))


def _recompute_grads(q, k, v, ranges, positions, scale, backend, strict, normalized, do, dlse):
    with torch.enable_grad():
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        outs = eager_selection_attention(q, k, v, ranges, positions, scale, backend, strict, normalized, dlse is not None)
        outs, grads = ((outs[0], outs[1]), (do, dlse)) if dlse is not None else ((outs,), (do,))
        dq, dk, dv = torch.autograd.grad(outs, (q, k, v), grads, allow_unused=True)
    return tuple(torch.zeros_like(x) if g is None else g for g, x in zip((dq, dk, dv), (q, k, v)))


@torch.library.custom_op("selgate::selection_attention_backward", mutates_args=())
def selection_attention_backward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ranges: torch.Tensor,
    positions: Optional[torch.Tensor],
    scale: Optional[float],
    backend: str,
    strict: Optional[bool],
    normalized: bool,
    do: torch.Tensor,
    dlse: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(dq, dk, dv)` of the call for output gradients `do` (and `dlse`)."""
    if q.is_cuda:
        return _triton_grads(q, k, v, ranges, positions, scale, backend, normalized, do, dlse)
    args = (q, k, v, ranges, positions, scale, backend, strict, normalized, do, dlse)
    return _grads.submit(_recompute_grads, *args).result()


def _triton_grads(q, k, v, ranges, positions, scale, backend, normalized, do, dlse):
    """The eager path's gradients on a device: the Triton kernels its autograd Function runs.
    A call the eager ladder would send elsewhere for gradients is refused, naming why."""
    from selgate.reference.ranges import normalize_ranges
    from selgate.reference.validation import check_inputs, resolve_scale

    from .policy import capability, dispatch_policy, triton_unsupported
    from .triton.bwd import triton_backward
    from .triton.fwd import triton_forward

    d = check_inputs(q, k, v, ranges, scale=scale, positions=positions)
    st = dispatch_policy()
    why = triton_unsupported(q, d.Dk, d.Dv, capability(q.device), st)
    if why is None and not st.allow_grad:
        why = ("grad", "SELGATE_TRITON_ALLOW_GRAD is off")
    if why is None and (backend not in ("auto", "triton") or st.force_parity):
        why = ("backend", f"backend={backend!r}")
    if why is not None:
        raise NotImplementedError(
            f"the compiled op's backward on CUDA runs the Triton kernels; this call cannot: {why[0]}: {why[1]}"
        )
    norm = ranges if normalized else normalize_ranges(ranges, d.S_kv, positions)
    sc = resolve_scale(scale, d.Dk)
    o, lse = triton_forward(q, k, v, norm, scale=sc, positions=positions)
    return triton_backward(q, k, v, o, lse, do, norm, scale=sc, positions=positions, dlse=dlse)


@selection_attention_backward_op.register_fake
def _(q, k, v, ranges, positions, scale, backend, strict, normalized, do, dlse):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, ranges, positions, scale, backend, strict, normalized, return_lse = inputs
    ctx.save_for_backward(q, k, v, ranges, positions)
    ctx.args = (scale, backend, strict, normalized)
    ctx.return_lse = return_lse


def _backward(ctx, do, dlse):
    q, k, v, ranges, positions = ctx.saved_tensors
    dlse = dlse if ctx.return_lse else None
    dq, dk, dv = selection_attention_backward_op(q, k, v, ranges, positions, *ctx.args, do, dlse)
    return dq, dk, dv, None, None, None, None, None, None, None


selection_attention_op.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("selgate::varlen_to_batched", mutates_args=())
def varlen_to_batched_op(
    ranges: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, T_kv: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(global ranges, positions)` of a varlen call (`reference.varlen.varlen_to_batched`) as
    an op, so `selection_attention_varlen` compiles with `fullgraph=True`: its checks read the
    offsets' values, which a traced graph cannot. Integer outputs: no autograd."""
    return varlen_to_batched(ranges, cu_seqlens_q, cu_seqlens_k, T_kv=T_kv)


@varlen_to_batched_op.register_fake
def _(ranges, cu_seqlens_q, cu_seqlens_k, T_kv):
    dtype = ranges.dtype if T_kv <= torch.iinfo(torch.int32).max else torch.int64  # as varlen_to_batched widens
    return ranges.new_empty(ranges.shape, dtype=dtype), ranges.new_empty((1, ranges.shape[1]), dtype=torch.int64)
