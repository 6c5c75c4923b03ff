"""Each kernel's limits are stated once, by the kernel, and the conformance registry and
the dispatcher read them; the registry checks each Triton forward kernel on its own."""

from __future__ import annotations

import os

import pytest
import torch

from selgate.conformance.cases import DTYPE_NAMES
from selgate.conformance.registry import REGISTRY
from selgate.kernels import capability_override, triton_limits
from selgate.kernels.cuda import decode as cuda_limits
from selgate.errors import BackendUnavailable
from selgate.device import capability_text, device_capability
from tests.helpers import random_inputs

CAN_LAUNCH = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_registry_declares_what_the_kernels_export():
    for name in ("triton", "triton-gather", "triton-tma"):
        impl = REGISTRY[name]
        assert (impl.dtypes, impl.head_dim_multiple, impl.max_head_dim) == (
            tuple(DTYPE_NAMES[d] for d in triton_limits.DTYPES),
            triton_limits.HEAD_DIM_MULTIPLE,
            triton_limits.MAX_HEAD_DIM,
        ), name
        assert impl.cpu_smoke_only and not (impl.backward and name != "triton"), name
    pairs = REGISTRY["triton-pairs"]
    assert (
        pairs.dtypes == tuple(DTYPE_NAMES[d] for d in triton_limits.PAIRS_DTYPES)
        and pairs.max_heads == triton_limits.PAIRS_MAX_HEADS
    )
    dims = [d for d in range(pairs.min_head_dim, pairs.max_head_dim + 1) if d % pairs.head_dim_multiple == 0]
    assert tuple(dims) == triton_limits.PAIRS_HEAD_DIMS and pairs.same_head_dims and pairs.cpu_smoke_only
    cuda = REGISTRY["cuda"]
    assert (cuda.dtypes, cuda.head_dim_multiple, cuda.max_head_dim) == (
        tuple(DTYPE_NAMES[d] for d in cuda_limits.DTYPES),
        cuda_limits.HEAD_DIM_MULTIPLE,
        cuda_limits.MAX_HEAD_DIM,
    )
    assert tuple(int(x) for x in cuda.min_capability.split(".")) == cuda_limits.MIN_CAPABILITY


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU machines only")
def test_pair_kernel_is_unavailable_without_a_gpu():
    assert "needs a GPU" in REGISTRY["triton-pairs"].unavailable()


def test_an_override_does_not_change_the_hardware_capability():
    real = device_capability(DEVICE)
    with capability_override("8.9"):
        assert device_capability(DEVICE) == real
    assert device_capability("cpu") is None


def test_the_current_device_has_a_capability_only_on_a_gpu():
    assert device_capability() == device_capability(DEVICE)  # None where no CUDA device is visible
    assert capability_text((9, 0)) == "9.0" and capability_text(None) is None


@pytest.mark.skipif(not CAN_LAUNCH, reason="Triton needs a GPU or TRITON_INTERPRET=1")
def test_a_named_kernel_refuses_a_call_it_cannot_take():
    from selgate.kernels.triton import forward_kernel_unsupported, selection_attention_kernel

    q, k, v, ranges = (t.to(DEVICE) for t in random_inputs(Dk=8, Dv=8, dtype=torch.float32)[:4])
    assert "no keys" in forward_kernel_unsupported("tma", q, k[:, :, :0], v[:, :, :0])
    with pytest.raises(BackendUnavailable) as err:
        selection_attention_kernel("pairs", q, k, v, ranges)  # fp32: never the pair kernel
    assert err.value.reason == "pairs"
    with pytest.raises(ValueError, match="kernel"):
        forward_kernel_unsupported("fastest", q, k, v)
