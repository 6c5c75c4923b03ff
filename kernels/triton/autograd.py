"""Autograd for the Triton path: the fused forward saves `o` and `lse`, the backward runs
the deterministic kernels of `bwd.py`. `lse` is differentiable too (its gradient enters
through `delta`), as it is in the reference."""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .bwd import triton_backward
from .fwd import triton_forward


class SelectionAttentionTriton(torch.autograd.Function):
    """`(o, lse)` of selection attention on normalised ranges, with Triton gradients."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, q, k, v, norm_ranges, scale, positions):
        o, lse = triton_forward(q, k, v, norm_ranges, scale=scale, positions=positions)
        ctx.save_for_backward(q, k, v, o, lse, norm_ranges, positions)
        ctx.scale = scale
        return o, lse

    @staticmethod
    @once_differentiable
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, do, dlse):
        q, k, v, o, lse, norm_ranges, positions = ctx.saved_tensors
        dq, dk, dv = triton_backward(q, k, v, o, lse, do, norm_ranges, scale=ctx.scale, positions=positions, dlse=dlse)
        return dq, dk, dv, None, None, None


def selection_attention_triton_autograd(q, k, v, norm_ranges, *, scale: float, positions=None):
    """Differentiable `(o, lse)` on the Triton kernels; `norm_ranges` must be normalised.

    Under autocast, q, k and v are cast to the autocast dtype first (like a matmul), so
    fp32 parameters train in fp16 or bf16 and receive fp32 gradients."""
    dev = q.device.type
    if torch.is_autocast_enabled(dev):
        low = torch.get_autocast_dtype(dev)
        q, k, v = (t.to(low) for t in (q, k, v))
    return SelectionAttentionTriton.apply(q, k, v, norm_ranges, float(scale), positions)
