"""The implementations under test, each declared once with what it supports (like
PyTorch's OpInfo). The matrix runs every declared combination; an undeclared one is a
skip whose reason names the missing capability, and a known bug is `xfail(strict=True)`
so its fix shows up. Kernels behind the dispatcher run strict, so a fallback can never be
compared with itself.

A user's implementation joins with `--impl package.module:callable`: the callable is
`fn(q, k, v, ranges, *, scale=None)` returning `o`, or `(o, lse)` when it declares lse.
Optional attributes on it declare capabilities (defaults in brackets): `dtypes`
[fp16, bf16, fp32] (torch dtypes or names), `supports_lse` [False], `supports_backward`
[False] (gradients through autograd), `modes` [("decode", "prefill")], `varlen`
[None] (a callable `(q, k, v, ranges, cu_seqlens_q, cu_seqlens_k, *, scale=None)` that
adds the varlen mode), `head_dim_multiple` [1], `max_head_dim` [None], `deterministic`
[True], `devices` [("cpu", "cuda")], `min_capability` [None].
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from .cases import SIZES, Case

LOW_AND_FP32 = (torch.float16, torch.bfloat16, torch.float32)
ALL_DTYPES = LOW_AND_FP32 + (torch.float64,)
BF16_INTERPRETER = "triton interpreter computes bf16 wrongly, triton issue 11584"


@dataclass(frozen=True)
class Xfail:
    """A known bug: `family` fails on cases where `applies(case)`; strict, so a fix shows."""

    family: str
    applies: Callable[[Case], bool]
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

    def forward(self, q, k, v, ranges, *, scale=None, want_lse=True):
        """`(o, lse)`, lse None when the implementation declares none."""
        out = self.call(q, k, v, ranges, scale=scale, want_lse=want_lse and self.lse)
        return _split(out, self.lse and want_lse)

    def forward_varlen(self, q, k, v, ranges, cu_q, cu_k, *, scale=None):
        return _split(self.varlen(q, k, v, ranges, cu_q, cu_k, scale=scale), self.lse)


def _split(out, with_lse):
    if with_lse:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError(f"an implementation declaring lse must return (o, lse), got {type(out).__name__}")
        return out
    return (out[0] if isinstance(out, tuple) else out), None


def device_capability(device) -> Optional[str]:
    if torch.device(device).type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}.{minor}"


def _cap(s: str) -> tuple:
    return tuple(int(x) for x in s.split("."))


def skip_reason(impl: Impl, case: Optional[Case], device, *, family: str = "", needs_backward=False,
                needs_fp64=False, needs_modes=None) -> Optional[str]:
    """Why `impl` does not run `case` (None: any case) of `family` on `device`, from its
    declarations; None when it does. `needs_modes` replaces the case's own mode (the
    decode family runs decode calls on prefill cases)."""
    dev = torch.device(device).type
    why = impl.unavailable()
    if why:
        return f"{impl.name} unavailable: {why}"
    if family in impl.unsupported:
        return f"{impl.name} does not take part in {family}: {impl.unsupported[family]}"
    if needs_backward and not impl.backward:
        return f"{impl.name} does not declare backward"
    if family.startswith("determinism") and not impl.deterministic:
        return f"{impl.name} declares itself non-deterministic"
    if case is None:
        return None
    if dev not in impl.devices:
        return f"{impl.name} runs on {'/'.join(impl.devices)}, not {dev}"
    cap = device_capability(device)
    if impl.min_capability and cap is not None and _cap(cap) < _cap(impl.min_capability):
        return f"{impl.name} needs compute capability >= {impl.min_capability}, device has {cap}"
    if case.dtype not in impl.dtypes:
        return f"{impl.name} does not declare {case.dtype}"
    if dev == "cpu" and case.dtype in impl.cpu_dtype_skips:
        return f"{impl.name} on CPU: {impl.cpu_dtype_skips[case.dtype]}"
    for mode in needs_modes or (case.mode,):
        if mode not in impl.modes or (mode == "varlen" and impl.varlen is None):
            return f"{impl.name} does not declare mode {mode}"
    s = case.shape
    for name, d in (("Dk", s.Dk), ("Dv", s.Dv)):
        if d % impl.head_dim_multiple or (impl.max_head_dim and d > impl.max_head_dim):
            return (f"{impl.name} declares head dims that are multiples of {impl.head_dim_multiple}"
                    f" up to {impl.max_head_dim}; {name}={d}")
    if SIZES.index(case.size) > SIZES.index(impl.max_size):
        return f"{impl.name} declares sizes up to {impl.max_size}; case is {case.size}"
    if dev == "cpu" and impl.cpu_smoke_only and not case.smoke:
        return f"{impl.name} is slow on CPU (interpreter): only smoke cases run there"
    if needs_fp64 and torch.float64 not in impl.dtypes:
        return f"{impl.name} does not declare fp64 (gradcheck needs it)"
    return None


def known_bug(impl: Impl, family: str, case: Case) -> Optional[str]:
    """The reason of a declared known bug of `impl` in `family` on `case`, or None."""
    for x in impl.xfails:
        if x.family == family and x.applies(case):
            return x.reason
    return None


# --- built-in implementations ---------------------------------------------------------------

def _reference_call(q, k, v, ranges, *, scale=None, want_lse=True, positions=None):
    from selgate.reference import selection_attention_ref
    return selection_attention_ref(q, k, v, ranges, scale=scale, positions=positions, return_lse=want_lse,
                                   formulation="mask")


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
        return selection_attention_varlen(q, k, v, ranges, cu_q, cu_k, scale=scale, backend=backend,
                                          return_lse=True, strict=True)

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


_triton_call, _triton_varlen = _dispatched("triton")
_cuda_call, _ = _dispatched("cuda")

REGISTRY = {
    # The dense-mask golden formulation, checked against the gather one the matrix compares
    # with; O(S * S_kv) memory, so not on large cases. Returns fp64 by design.
    "reference": Impl("reference", _reference_call, dtypes=ALL_DTYPES, varlen=_reference_varlen, backward=True,
                      lse=True, result_dtype=torch.float64, max_size="small",
                      unsupported={"bounds": "the dense-mask formulation weighs every key, NaN ones included, "
                                             "by zero: it reads outside the selection by design"}),
    "sdpa": Impl("sdpa", _sdpa_call, dtypes=ALL_DTYPES, varlen=_sdpa_varlen, backward=True, lse=True),
    "triton": Impl("triton", _triton_call, varlen=_triton_varlen, head_dim_multiple=8, max_head_dim=256,
                   backward=_triton_has_backward(), lse=True, cpu_smoke_only=True,
                   cpu_dtype_skips={torch.bfloat16: BF16_INTERPRETER}, unavailable=_triton_unavailable),
    "cuda": Impl("cuda", _cuda_call, modes=("decode",), head_dim_multiple=8, max_head_dim=256, devices=("cuda",),
                 min_capability="8.0", lse=True, unavailable=_cuda_unavailable),
}


# --- user implementations (--impl) ----------------------------------------------------------

_DTYPE_BY_NAME = {"fp16": torch.float16, "float16": torch.float16, "bf16": torch.bfloat16,
                  "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32,
                  "fp64": torch.float64, "float64": torch.float64}


def _dtype(x, spec):
    if isinstance(x, torch.dtype):
        return x
    if x in _DTYPE_BY_NAME:
        return _DTYPE_BY_NAME[x]
    raise ValueError(f"--impl {spec}: dtypes entry {x!r} is not a torch dtype or one of {sorted(_DTYPE_BY_NAME)}")


def load_user_impl(spec: str) -> Impl:
    """The Impl of `--impl package.module:callable`, capabilities read from its attributes."""
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise ValueError(f"--impl: expected 'package.module:callable' or one of {sorted(REGISTRY)}, got {spec!r}")
    try:
        fn = importlib.import_module(mod_name)
        for part in attr.split("."):
            fn = getattr(fn, part)
    except (ImportError, AttributeError) as e:
        raise type(e)(f"--impl {spec}: {e}") from e
    if not callable(fn):
        raise TypeError(f"--impl {spec}: {type(fn).__name__} is not callable")
    varlen = getattr(fn, "varlen", None)
    modes = tuple(getattr(fn, "modes", ("decode", "prefill"))) + (("varlen",) if varlen else ())

    def call(q, k, v, ranges, *, scale=None, want_lse=True):
        return fn(q, k, v, ranges, scale=scale)

    return Impl(
        name=spec, call=call, varlen=varlen, modes=modes,
        dtypes=tuple(_dtype(d, spec) for d in getattr(fn, "dtypes", LOW_AND_FP32)),
        lse=bool(getattr(fn, "supports_lse", False)), backward=bool(getattr(fn, "supports_backward", False)),
        head_dim_multiple=int(getattr(fn, "head_dim_multiple", 1)), max_head_dim=getattr(fn, "max_head_dim", None),
        deterministic=bool(getattr(fn, "deterministic", True)), devices=tuple(getattr(fn, "devices", ("cpu", "cuda"))),
        min_capability=getattr(fn, "min_capability", None),
    )


def resolve(spec: Optional[str]) -> list:
    """Implementations named by `--impl`: comma-separated registry names or
    `package.module:callable` specs; every registered one when `spec` is empty."""
    if not spec:
        return list(REGISTRY.values())
    out = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        if item in REGISTRY:
            out.append(REGISTRY[item])
        elif ":" in item:
            out.append(load_user_impl(item))
        else:
            raise ValueError(f"--impl: {item!r} is neither a registered implementation {sorted(REGISTRY)} "
                             f"nor 'package.module:callable'")
    return out
