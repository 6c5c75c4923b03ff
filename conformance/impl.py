"""What an implementation under test declares (like PyTorch's OpInfo) and what follows from
it alone: the `Impl` record, why it skips a case, the case fitted to its heads and block size,
its declared known bugs. No torch here: the process that judges a `selgate check` holds the
kernel's declarations without importing torch or the kernel (`described_impl`); the built-in
implementations live in `registry.py`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

from . import declarations
from .sizes import SIZES
from .tolerances import Precision, judged_as

if TYPE_CHECKING:
    import torch

    from .cases import Case

LOW_AND_FP32 = ("fp16", "bf16", "fp32")
ALL_DTYPES = LOW_AND_FP32 + ("fp64",)


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
    dtypes: tuple = LOW_AND_FP32  # names (declarations.DTYPES)
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
    cpu_dtype_skips: dict = field(default_factory=dict)  # dtype name -> why its cases do not run on CPU
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
    from selgate.device import capability_text, device_capability

    dev = str(device).partition(":")[0]
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
    if case.dtype_name not in impl.dtypes:
        return f"{impl.name} does not declare {case.dtype}"
    if dev == "cpu" and case.dtype_name in impl.cpu_dtype_skips:
        return f"{impl.name} on CPU: {impl.cpu_dtype_skips[case.dtype_name]}"
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
