"""The implementations under test, each declared once with what it supports (like
PyTorch's OpInfo, `impl.Impl`). The matrix runs every declared combination; an undeclared one is a
skip whose reason names the missing capability, and a known bug is `xfail(strict=True)`
so its fix shows up. Kernels behind the dispatcher run strict, so a fallback can never be
compared with itself.

A user's implementation joins with `--impl package.module:callable`: the callable is
`fn(q, k, v, ranges, *, scale=None)` returning `o`, or `(o, lse)` when it declares lse.
What it supports and requires is declared by attributes on it or in a `--declare` YAML
file (`declarations.py` lists the keys); the matrix fits its cases to those declarations.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys
from typing import Optional

import torch

from selgate.device import capability_text, device_capability
from selgate.kernels import triton_limits
from selgate.kernels.cuda import decode as cuda_limits

from . import declarations
from .cases import DTYPE_NAMES
from .impl import ALL_DTYPES, Impl, user_impl

# --- built-in implementations ---------------------------------------------------------------


def _reference_call(q, k, v, ranges, *, scale=None, want_lse=True, positions=None):
    from selgate.reference import selection_attention_ref

    return selection_attention_ref(q, k, v, ranges, scale=scale, positions=positions, return_lse=want_lse, formulation="mask")


def _reference_varlen(q, k, v, ranges, cu_q, cu_k, *, scale=None):
    """Packed sequences through the gather formulation: the varlen family poisons the keys no
    row selects, which the dense mask would read (its varlen check is the packing itself)."""
    from selgate.reference import selection_attention_ref, varlen_to_batched

    glob, pos = varlen_to_batched(ranges, cu_q, cu_k)
    return selection_attention_ref(q, k, v, glob, scale=scale, positions=pos, return_lse=True)


def _sdpa_call(q, k, v, ranges, *, scale=None, want_lse=True):
    from selgate.kernels.sdpa import selection_attention_sdpa

    return selection_attention_sdpa(q, k, v, ranges, scale=scale, return_lse=want_lse)


def _dispatched(backend: str):
    """Calls through the dispatcher, strict, so a fallback fails instead of passing."""

    def call(q, k, v, ranges, *, scale=None, want_lse=True):
        from selgate.kernels import selection_attention

        return selection_attention(q, k, v, ranges, scale=scale, backend=backend, return_lse=want_lse, strict=True)

    def varlen(q, k, v, ranges, cu_q, cu_k, *, scale=None):
        from selgate.kernels import selection_attention_varlen

        return selection_attention_varlen(q, k, v, ranges, cu_q, cu_k, scale=scale, backend=backend, return_lse=True, strict=True)

    return call, varlen


def _sdpa_varlen(q, k, v, ranges, cu_q, cu_k, *, scale=None):
    return _dispatched("sdpa")[1](q, k, v, ranges, cu_q, cu_k, scale=scale)


def _triton_unavailable() -> Optional[str]:
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return "no CUDA device, and TRITON_INTERPRET=1 is not set"
    if importlib.util.find_spec("selgate.kernels.triton") is None:
        return "selgate.kernels.triton is missing"
    fwd = sys.modules.get("selgate.kernels.triton.fwd")
    if fwd is not None and not torch.cuda.is_available():
        from triton.runtime.jit import JITFunction

        if any(isinstance(f, JITFunction) for f in vars(fwd).values()):
            return "selgate.kernels.triton was imported before TRITON_INTERPRET=1 was set (set it before pytest)"
    return None


def _triton_has_backward() -> bool:
    try:  # finding the submodule imports its package, which imports triton
        return importlib.util.find_spec("selgate.kernels.triton.autograd") is not None
    except ImportError:
        return False


def _cuda_unavailable() -> Optional[str]:
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        importlib.import_module("selgate.kernels.cuda").selection_attention_cuda  # noqa: B018
    except (ImportError, AttributeError) as e:
        return f"selgate.kernels.cuda cannot be imported: {e}"
    return None


def _kernel(kernel: str):
    """Calls one Triton forward kernel by name (`selection_attention_kernel`), strict."""

    def call(q, k, v, ranges, *, scale=None, want_lse=True, positions=None):
        from selgate.kernels.triton import selection_attention_kernel

        return selection_attention_kernel(kernel, q, k, v, ranges, scale=scale, positions=positions, return_lse=want_lse)

    def varlen(q, k, v, ranges, cu_q, cu_k, *, scale=None):
        from selgate.reference import varlen_to_batched

        glob, pos = varlen_to_batched(ranges, cu_q, cu_k, T_kv=k.shape[2])
        return call(q, k, v, glob, scale=scale, positions=pos)

    return call, varlen


def _tma_unavailable() -> Optional[str]:
    why = _triton_unavailable()
    cap = device_capability()
    if why is None and cap is not None and cap < triton_limits.TMA_MIN_CAPABILITY:
        need = capability_text(triton_limits.TMA_MIN_CAPABILITY)
        why = f"the TMA kernel needs SM >= {need}, device has {capability_text(cap)}"
    return why


def _pairs_unavailable() -> Optional[str]:
    if not torch.cuda.is_available():
        return "the Gluon pair kernel needs a GPU (the Triton interpreter does not run Gluon)"
    why = _triton_unavailable()
    if why:
        return why
    major = triton_limits.PAIRS_CAPABILITY_MAJOR
    cap = device_capability("cuda")
    if cap[0] != major:
        return f"the Gluon pair kernel runs on SM {major}.x only, device has {capability_text(cap)}"
    if importlib.util.find_spec("triton.experimental.gluon") is None:
        return "this triton has no Gluon"
    return None


_triton_call, _triton_varlen = _dispatched("triton")
_cuda_call, _ = _dispatched("cuda")
_gather_call, _gather_varlen = _kernel("gather")
_tma_call, _tma_varlen = _kernel("tma")
_pairs_call, _ = _kernel("pairs")
_kv_outer_call, _kv_outer_varlen = _kernel("kv_outer")


def _names(dtypes) -> tuple:
    """The declared names of a kernel's torch dtypes."""
    return tuple(DTYPE_NAMES[d] for d in dtypes)


# Declared from the kernels' own limits (selgate.kernels.triton_limits, kernels/cuda/decode.py).
_TRITON = dict(
    dtypes=_names(triton_limits.DTYPES),
    head_dim_multiple=triton_limits.HEAD_DIM_MULTIPLE,
    max_head_dim=triton_limits.MAX_HEAD_DIM,
    lse=True,
    cpu_smoke_only=True,
    cpu_dtype_skips={"bf16": triton_limits.BF16_INTERPRETER},
)

REGISTRY = {
    # The dense-mask golden formulation, checked against the gather one the matrix compares
    # with; O(S * S_kv) memory, so not on large cases. Returns fp64 by design.
    "reference": Impl(
        "reference",
        _reference_call,
        dtypes=ALL_DTYPES,
        varlen=_reference_varlen,
        backward=True,
        lse=True,
        result_dtype=torch.float64,
        max_size="small",
        unsupported={
            "bounds": "the dense-mask formulation weighs every key, NaN ones included, "
            "by zero: it reads outside the selection by design"
        },
    ),
    "sdpa": Impl("sdpa", _sdpa_call, dtypes=ALL_DTYPES, varlen=_sdpa_varlen, backward=True, lse=True),
    # Through the dispatcher: the forward kernel the profile picks, and the Triton backward.
    "triton": Impl(
        "triton", _triton_call, varlen=_triton_varlen, backward=_triton_has_backward(), unavailable=_triton_unavailable, **_TRITON
    ),
    # Each Triton forward kernel on its own, forward only.
    "triton-gather": Impl("triton-gather", _gather_call, varlen=_gather_varlen, unavailable=_triton_unavailable, **_TRITON),
    # Whole tiles through tensor descriptors: contiguous K/V, so every call takes that path.
    "triton-tma": Impl(
        "triton-tma", _tma_call, varlen=_tma_varlen, unavailable=_tma_unavailable, layouts=("contiguous",), **_TRITON
    ),
    # KV tiles outside, each row's tiles merged after (kernels/triton/kv_outer.py); prefill only.
    "triton-kv-outer": Impl(
        "triton-kv-outer", _kv_outer_call, varlen=_kv_outer_varlen, modes=("prefill",), unavailable=_triton_unavailable, **_TRITON
    ),
    "triton-pairs": Impl(
        "triton-pairs",
        _pairs_call,
        modes=("prefill",),
        dtypes=_names(triton_limits.PAIRS_DTYPES),
        head_dim_multiple=math.gcd(*triton_limits.PAIRS_HEAD_DIMS),
        min_head_dim=min(triton_limits.PAIRS_HEAD_DIMS),
        max_head_dim=max(triton_limits.PAIRS_HEAD_DIMS),
        same_head_dims=True,
        max_heads=triton_limits.PAIRS_MAX_HEADS,
        layouts=("contiguous",),
        lse=True,
        cpu_smoke_only=True,
        unavailable=_pairs_unavailable,
    ),
    "cuda": Impl(
        "cuda",
        _cuda_call,
        modes=("decode",),
        dtypes=_names(cuda_limits.DTYPES),
        head_dim_multiple=cuda_limits.HEAD_DIM_MULTIPLE,
        max_head_dim=cuda_limits.MAX_HEAD_DIM,
        devices=("cuda",),
        min_capability=capability_text(cuda_limits.MIN_CAPABILITY),
        lse=True,
        unavailable=_cuda_unavailable,
    ),
}


# --- user implementations (--impl) ----------------------------------------------------------


def load_user_impl(spec: str, declare=None, what: str = "--impl") -> Impl:
    """The Impl of `--impl package.module:callable`: declarations from its attributes, then
    from the `declare` YAML file, which wins key by key. `what` names the argument in errors."""
    fn = declarations.load_callable(spec, what)
    declared = declarations.from_callable(fn, spec, what)
    if declare:
        declared.update(declarations.from_yaml(declare))
    return user_impl(spec, declared, fn)


def resolve(spec: Optional[str], declare=None) -> list:
    """Implementations named by `--impl`: comma-separated registry names or
    `package.module:callable` specs; every registered one when `spec` is empty. `declare`
    (a YAML file) declares the one `package.module:callable` among them."""
    items = [s.strip() for s in (spec or "").split(",") if s.strip()]
    outside = [i for i in items if i not in REGISTRY]
    if declare and len(outside) != 1:
        raise ValueError(
            f"--declare {declare}: declares one package.module:callable named by --impl; "
            f"--impl names {len(outside)} ({', '.join(outside) or 'none'})"
        )
    if not items:
        return list(REGISTRY.values())
    out = []
    for item in items:
        if item in REGISTRY:
            out.append(REGISTRY[item])
        elif ":" in item:
            out.append(load_user_impl(item, declare))
        else:
            raise ValueError(
                f"--impl: {item!r} is neither a registered implementation {sorted(REGISTRY)} nor 'package.module:callable'"
            )
    return out
