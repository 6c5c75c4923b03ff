"""selgate's own Triton kernels (forward and backward) checked as an outside kernel would be:

    selgate check selgate_triton:selection        # from this folder

The same matrix the lanes run on `triton`, through the product's front door, so the check's
verdict on a kernel known to be right is itself checked: its determinism families pass where
an atomic backward (`selgate.conformance.badimpls:atomic_dk_dv`) is blocked."""

from __future__ import annotations

from selgate.kernels import selection_attention, triton_limits


def selection(q, k, v, ranges, *, scale=None):
    return selection_attention(q, k, v, ranges, scale=scale, backend="triton", return_lse=True, strict=True)


selection.devices = ["cuda"]
selection.lse = True
selection.backward = True
selection.head_dim_multiple = triton_limits.HEAD_DIM_MULTIPLE
selection.max_head_dim = triton_limits.MAX_HEAD_DIM
