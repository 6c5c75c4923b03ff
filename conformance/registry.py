"""The implementations under test, each declared once with what it supports (like
PyTorch's OpInfo). The matrix runs every declared combination; an undeclared one is a
skip whose reason names the missing capability, and a known bug is `xfail(strict=True)`
so its fix shows up. Kernels behind the dispatcher run strict, so a fallback can never be
compared with itself.

A user's implementation joins with `--impl package.module:callable`: the callable is
`fn(q, k, v, ranges, *, scale=None)` returning `o`, or `(o, lse)` when it declares lse.
What it supports and requires is declared by attributes on it or in a `--declare` YAML
file (`declarations.py` lists the keys); the matrix fits its cases to those declarations.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from selgate.device import capability_text, device_capability
from selgate.kernels import triton_limits
from selgate.kernels.cuda import decode as cuda_limits

from . import declarations
from .cases import Case
from .sizes import SIZES
from .tolerances import Precision, judged_as

LOW_AND_FP32 = (torch.float16, torch.bfloat16, torch.float32)
ALL_DTYPES = LOW_AND_FP32 + (torch.float64,)


@dataclass(frozen=True)
class Xfail:
    """A known bug: `family` fails on the cases whose id (a bad input's name; for limits, the
    limit in words and the case id: `head-dims-above-the-maximum-*`) matches the fnmatch pattern
    `cases`; strict, so a fix shows."""

    family: str
    cases: str
    reason: str


@dataclass(frozen=True)
class Impl:
    """One implementation and its declared capabilities.

    `call(q, k, v, ranges, scale=..., want_lse=...)` returns `o` or `(o, lse)`;
    `want_lse` lets an implementation with two code paths (with and without lse) be
    exercised on both. `varlen` has the signature of `selection_attention_varlen`."""

    name: str
    call: Callable
    dtypes: tuple = LOW_AND_FP32
    modes: tuple = ("decode", "prefill", "varlen")
    varlen: Optional[Callable] = None
    head_dim_multiple: int = 1
    min_head_dim: int = 1
    max_head_dim: Optional[int] = None
    devices: tuple = ("cpu", "cuda")
    min_capability: Optional[str] = None
    backward: bool = False
    lse: bool = False
    deterministic: bool = True
    result_dtype: Optional[torch.dtype] = None  # None: o in v's dtype, lse fp32
    max_size: str = "large"
    cpu_smoke_only: bool = False  # slow on CPU (an interpreter): runs only smoke cases there
    cpu_dtype_skips: dict = field(default_factory=dict)
    unavailable: Callable[[], Optional[str]] = lambda: None
    unsupported: dict = field(default_factory=dict)  # family -> why it does not apply, by design
    xfails: tuple = ()
    heads_multiple_of: int = 1
    heads_power_of_two: bool = False
    min_heads: int = 1
    max_heads: Optional[int] = None
    same_head_dims: bool = False  # Dk == Dv only
    fp32_matmul: str = "ieee"  # tf32: fp32 inputs are judged as TF32 (declarations.FP32_MATMULS)
    block_size: Optional[int] = None
    layouts: tuple = declarations.LAYOUTS
    declared: dict = field(default_factory=dict)  # an outside kernel's declarations, as given
    spec: Optional[str] = None  # where another process loads it (`package.module:callable`); None for registered ones

    def forward(self, q, k, v, ranges, *, scale=None, want_lse=True):
        """`(o, lse)`, lse None when the implementation declares none."""
        out = self.call(*self._laid_out(q, k, v), ranges, scale=scale, want_lse=want_lse and self.lse)
        return _split(out, self.lse and want_lse)

    def forward_varlen(self, q, k, v, ranges, cu_q, cu_k, *, scale=None):
        return _split(self.varlen(*self._laid_out(q, k, v), ranges, cu_q, cu_k, scale=scale), self.lse)

    def _laid_out(self, q, k, v):
        """Contiguous copies for a kernel that does not declare strided inputs; K and V rows in one
        buffer stay so where it declares `kv_shared` (copied, its shared-buffer case would hand it
        two separate tensors and check nothing)."""
        if "strided" in self.layouts:
            return q, k, v
        shared = "kv_shared" in self.layouts and k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
        return q.contiguous(), *((k, v) if shared else (k.contiguous(), v.contiguous()))

    def judged_as(self, dtype: torch.dtype) -> Precision:
        """The precision this implementation's results on `dtype` inputs are judged in."""
        return judged_as(dtype, self.fp32_matmul)

    def heads_for(self, h: int) -> Optional[int]:
        """The heads-per-group count this implementation runs a case of `h` heads at."""
        return declarations.allowed_heads(
            h,
            multiple_of=self.heads_multiple_of,
            power_of_two=self.heads_power_of_two,
            minimum=self.min_heads,
            maximum=self.max_heads,
        )


def _split(out, with_lse):
    if with_lse:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError(f"an implementation declaring lse must return (o, lse), got {type(out).__name__}")
        return out
    return (out[0] if isinstance(out, tuple) else out), None


def _cap(s: str) -> tuple:
    return tuple(int(x) for x in s.split("."))


def skip_reason(impl: Impl, case: Case, device, *, modes=None) -> Optional[str]:
    """Why `impl` does not run `case` on `device`, from the declarations every family shares
    (what a family itself requires is its own: `Family.skip`); None when it does. `modes`
    replaces the case's own mode (the decode family runs decode calls on prefill cases)."""
    dev = torch.device(device).type
    why = impl.unavailable()
    if why:
        return f"{impl.name} unavailable: {why}"
    if dev not in impl.devices:
        return f"{impl.name} runs on {'/'.join(impl.devices)}, not {dev}"
    if case.gpu_only and dev != "cuda":
        return "a contention case: reduction-order races (atomics) show on a GPU only"
    cap = capability_text(device_capability(device))  # overrides do not change what a kernel runs on
    if impl.min_capability and cap is not None and _cap(cap) < _cap(impl.min_capability):
        return f"{impl.name} needs compute capability >= {impl.min_capability}, device has {cap}"
    if case.dtype not in impl.dtypes:
        return f"{impl.name} does not declare {case.dtype}"
    if dev == "cpu" and case.dtype in impl.cpu_dtype_skips:
        return f"{impl.name} on CPU: {impl.cpu_dtype_skips[case.dtype]}"
    for mode in modes or (case.mode,):
        if mode not in impl.modes or (mode == "varlen" and impl.varlen is None):
            return f"{impl.name} does not declare mode {mode}"
    s = case.shape
    if impl.heads_for(s.h) != s.h:
        return f"{impl.name} declares heads per group {_heads_rule(impl)}; case has {s.h}"
    if impl.block_size is not None and case.block_size != impl.block_size:
        return f"{impl.name} selects whole blocks of {impl.block_size} keys; case is not block-aligned"
    if impl.same_head_dims and s.Dk != s.Dv:
        return f"{impl.name} declares Dk == Dv; case has Dk={s.Dk}, Dv={s.Dv}"
    for name, d in (("Dk", s.Dk), ("Dv", s.Dv)):
        if d % impl.head_dim_multiple or d < impl.min_head_dim or (impl.max_head_dim and d > impl.max_head_dim):
            return (
                f"{impl.name} declares head dims that are multiples of {impl.head_dim_multiple}"
                f" from {impl.min_head_dim} up to {impl.max_head_dim}; {name}={d}"
            )
    if SIZES.index(case.size) > SIZES.index(impl.max_size):
        return f"{impl.name} declares sizes up to {impl.max_size}; case is {case.size}"
    if dev == "cpu" and impl.cpu_smoke_only and not case.smoke:
        return f"{impl.name} is slow on CPU (interpreter): only smoke cases run there"
    return None


def _heads_rule(impl: Impl) -> str:
    rule = [f"a multiple of {impl.heads_multiple_of}"] if impl.heads_multiple_of > 1 else []
    rule += ["a power of two"] if impl.heads_power_of_two else []
    rule += [f">= {impl.min_heads}"] if impl.min_heads > 1 else []
    rule += [f"<= {impl.max_heads}"] if impl.max_heads is not None else []
    return ", ".join(rule) or "any"


def fit(case: Case, impl: Impl) -> Case:
    """`case` with the heads per group and the selection granularity `impl` declares, so a
    constrained kernel meets every shape's other dimensions (an unfittable case is kept as
    it is, and skip_reason says why it does not run)."""
    h = impl.heads_for(case.shape.h)
    shape = case.shape if h is None else dataclasses.replace(case.shape, h=h)
    if shape == case.shape and case.block_size == impl.block_size:
        return case
    return dataclasses.replace(case, shape=shape, block_size=impl.block_size)


def known_bug(impl: Impl, family: str, case: Case, label: Optional[str] = None) -> Optional[str]:
    """The reason of a declared known bug of `impl` in `family` on `case` (or on the bad
    input named `label`), or None."""
    for x in impl.xfails:
        if x.family == family and fnmatch.fnmatchcase(label or case.id, x.cases):
            return x.reason
    return None


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

# Declared from the kernels' own limits (selgate.kernels.triton_limits, kernels/cuda/decode.py).
_TRITON = dict(
    dtypes=triton_limits.DTYPES,
    head_dim_multiple=triton_limits.HEAD_DIM_MULTIPLE,
    max_head_dim=triton_limits.MAX_HEAD_DIM,
    lse=True,
    cpu_smoke_only=True,
    cpu_dtype_skips={torch.bfloat16: triton_limits.BF16_INTERPRETER},
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
        dtypes=triton_limits.PAIRS_DTYPES,
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
        dtypes=cuda_limits.DTYPES,
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


def user_impl(spec: str, declared: dict, fn: Callable) -> Impl:
    """The Impl of the outside callable `fn` named `spec`, from its validated declarations."""
    varlen = declared.get("varlen")
    modes = tuple(declared.get("modes", declarations.MODES)) + (("varlen",) if varlen else ())

    def call(q, k, v, ranges, *, scale=None, want_lse=True):
        return fn(q, k, v, ranges, scale=scale)

    fields = {k: v for k, v in declared.items() if k not in ("modes", "varlen", "xfail")}
    xfails = tuple(Xfail(*x) for x in declared.get("xfail", ()))
    return Impl(name=spec, call=call, varlen=varlen, modes=modes, xfails=xfails, declared=declared, spec=spec, **fields)


def not_loaded(*args, **kwargs):
    """Stands for an outside callable in a process that must not import it (the check's verdict)."""
    raise RuntimeError("this process describes the implementation and never calls it")


def described_impl(spec: str, data: dict) -> Impl:
    """The Impl `declarations.to_json` described, without importing the implementation."""
    return user_impl(spec, declarations.from_json(data, not_loaded), not_loaded)


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
