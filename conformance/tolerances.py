"""Acceptance bounds of SPEC.md ("Numerics"), in one place, overridable by a lane.

An implementation is judged in a `Precision` (`judged_as`): its inputs' dtype, or `tf32` for
fp32 inputs of a kernel that declares `fp32_matmul: tf32` (its matmuls round their operands
to 10 mantissa bits, so the fp32 bar would fail it for what it declared; never assumed).

- fp32: max abs error <= 1e-5, mean abs error <= 1e-6 (per tensor: o, lse, dq, dk, dv).
- fp16 / bf16: max abs error <= factor x the error of a plain PyTorch run in that precision
  (factor 2 for o and lse, 3 for gradients) + `floor_eps * eps(dtype) * max|ref|`; mean abs
  error <= max(1e-3, eps(dtype) x mean|ref|). The second term departs from SPEC.md: rounding
  an exact result to bf16 alone costs about eps/4 x mean|ref|, so bf16 gradients of size ~1
  cannot meet 1e-3 (measured: sdpa dk mean error 1.01e-3 on
  prefill-B1S4Skv21-G2h16-D8x8-n5-builder-bf16-s0, whose max error is 10x under its bound).
  It applies to the tensors stored in the low precision (o and the gradients), not to lse,
  which is fp32 whatever the inputs and is held to SPEC.md's 1e-3.
- tf32: the fp16 rule with eps = 2^-10, the plain run being the fp32 one with TF32 matmuls
  allowed (`Precision.matmuls`; on an H200, torch 2.11, its o error reached 1.7e-3 on the small
  fp32 cases, where fla-core's TF32 kernels measured 1.8e-3). A CPU has no TF32, so there that
  run is IEEE fp32 and the noise floor carries the bound.
- fp64 (gradcheck inputs only; SPEC.md is silent): the two golden formulations agree to
  1e-12, so an fp64 implementation is held to max 1e-10, mean 1e-12.

A lane overrides any field with `SELGATE_TOL_OVERRIDES`: inline YAML/JSON or the path of
a YAML/JSON file, keyed by precision name (fp64, fp32, tf32, fp16, bf16: `tf32` is its
own key, so loosening fp32 never loosens TF32 or back), optionally narrowed to one tensor, e.g.
`{fp32: {max_abs: 2.0e-5}, bf16: {grad: {mean_abs: 2.0e-3}}, fp16: {dk: {factor: 4}}}`
(tensor keys: o, lse, dq, dk, dv, and `grad` for all three gradients). Precedence:
SPEC.md defaults < precision-level override < `grad` override < single-tensor override.
Every bound is a finite number >= 0: a NaN bound would pass everything (`err > nan` is
False). The lane runner sets the variable from the lane YAML only, and the gate blocks a
run whose overrides are not the lane YAML's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union

import yaml

from selgate import env_vars

if TYPE_CHECKING:  # torch loads where a precision is first used: the lane runner and the gate parse
    import torch  # overrides without it

ENV = "SELGATE_TOL_OVERRIDES"
GRADS = ("dq", "dk", "dv")
TENSORS = ("o", "lse") + GRADS


@dataclass(frozen=True)
class Precision:
    """What an implementation's results are judged as: `dtype` computed with unit roundoff
    `eps`; `name` keys the SPEC.md rule and the lane's overrides, and failure messages say it."""

    name: str
    dtype: torch.dtype
    eps: float

    @property
    def plain_scaled(self) -> bool:
        """The bound scales with the error of a plain PyTorch run in this precision."""
        return _SPEC[self.name]["o"].relative

    def round(self, t: torch.Tensor) -> torch.Tensor:
        """`t` in this precision. TF32 keeps fp32's exponent and 10 mantissa bits: rounded to
        nearest here, since a tensor core rounds its operands so whatever the shape, while
        cuBLAS takes the TF32 path only for some (a decode's matrix-vector product stays
        IEEE fp32, and the plain run's error then measured 2e-7 beside fla-core's 2e-3)."""
        import torch

        t = t.to(self.dtype)
        if self.name != "tf32":
            return t
        bits = t.contiguous().view(torch.int32)
        rounded = ((bits + 0x1000) & ~0x1FFF).view(torch.float32)
        return torch.where(torch.isfinite(t), rounded, t).view(t.shape)

    @contextlib.contextmanager
    def matmuls(self):
        """The matmul settings of a plain PyTorch run in this precision: TF32 allowed for
        tf32 (restored afterwards), left as they are otherwise."""
        if self.name != "tf32":
            yield
            return
        import torch

        cuda, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
        saved = cuda.allow_tf32, cudnn.allow_tf32
        cuda.allow_tf32 = cudnn.allow_tf32 = True
        try:
            yield
        finally:
            cuda.allow_tf32, cudnn.allow_tf32 = saved


@functools.cache
def _precisions() -> dict:
    import torch

    from .cases import DTYPE_NAMES

    by_dtype = {dt: Precision(name, dt, torch.finfo(dt).eps) for dt, name in DTYPE_NAMES.items()}
    return by_dtype, Precision("tf32", torch.float32, 2.0**-10)


def judged_as(dtype: torch.dtype, fp32_matmul: str = "ieee") -> Precision:
    """The precision an implementation declaring `fp32_matmul` (ieee, tf32) is judged in on
    `dtype` inputs."""
    by_dtype, tf32 = _precisions()
    precision = by_dtype[dtype]
    return tf32 if fp32_matmul == "tf32" and precision.name == "fp32" else precision


@dataclass(frozen=True)
class Tolerance:
    """Bounds for one tensor in one precision. `factor`/`floor_eps` are None for absolute bounds."""

    max_abs: Optional[float] = None
    mean_abs: float = 0.0
    mean_floor_eps: float = 0.0
    factor: Optional[float] = None
    floor_eps: float = 0.0
    source: str = "SPEC.md"

    @property
    def relative(self) -> bool:
        return self.factor is not None


_SPEC = {
    "fp64": {"o": Tolerance(max_abs=1e-10, mean_abs=1e-12, source="fp64: golden formulations agree to 1e-12")},
    "fp32": {"o": Tolerance(max_abs=1e-5, mean_abs=1e-6)},
    "fp16": {
        "o": Tolerance(factor=2.0, floor_eps=2.0, mean_abs=1e-3, mean_floor_eps=1.0),
        # lse is fp32 whatever the inputs: no output rounding, so no mean floor (with it,
        # an lse rounded through bf16 passed every bf16 parity case).
        "lse": Tolerance(factor=2.0, floor_eps=2.0, mean_abs=1e-3),
        "grad": Tolerance(factor=3.0, floor_eps=2.0, mean_abs=1e-3, mean_floor_eps=1.0),
    },
}
_SPEC["bf16"] = _SPEC["fp16"]
_SPEC["tf32"] = {
    k: dataclasses.replace(t, source="SPEC.md: fp32 with TF32 matmuls, the fp16 rule with eps 2^-10")
    for k, t in _SPEC["fp16"].items()
}


@functools.lru_cache(maxsize=8)
def parse_overrides(raw: str) -> dict:
    text = Path(raw).read_text() if raw and Path(raw).is_file() else raw
    data = yaml.safe_load(text) if text else {}
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{ENV}: expected a mapping keyed by precision name, got {type(data).__name__}: {raw!r}")
    fields = {f.name for f in dataclasses.fields(Tolerance)} - {"source"}
    for dt, spec in data.items():
        if dt not in _SPEC or not isinstance(spec, dict):
            raise ValueError(f"{ENV}: key {dt!r} must be one of {sorted(_SPEC)} mapping to fields, got {spec!r}")
        for key, val in spec.items():
            if key in TENSORS or key == "grad":
                bad = set(val) - fields if isinstance(val, dict) else {val}
            else:
                bad = set() if key in fields else {key}
            if bad:
                raise ValueError(
                    f"{ENV}: {dt}.{key}: unknown fields {sorted(map(str, bad))}; "
                    f"expected tensor keys {TENSORS + ('grad',)} or fields {sorted(fields)}"
                )
            for name, bound_ in val.items() if isinstance(val, dict) else [(None, val)]:
                check_bound(bound_, f"{ENV}: {dt}.{key}" + (f".{name}" if name else ""))
    return data


def check_bound(value, where: str) -> None:
    """A bound is a finite number >= 0; ValueError names where it is not."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: expected a finite number >= 0, got {value!r}")


def overrides() -> dict:
    """The lane's overrides from `SELGATE_TOL_OVERRIDES` (validated; {} when unset)."""
    return parse_overrides(env_vars.get(ENV))


def as_precision(precision: Union[Precision, torch.dtype]) -> Precision:
    """`precision`, a bare dtype standing for its own IEEE arithmetic."""
    return precision if isinstance(precision, Precision) else judged_as(precision)


def tolerance(precision: Union[Precision, torch.dtype], tensor: str) -> Tolerance:
    """The bound for `tensor` (o, lse, dq, dk, dv) of an implementation judged in `precision`."""
    if tensor not in TENSORS:
        raise ValueError(f"tensor: expected one of {TENSORS}, got {tensor!r}")
    name = as_precision(precision).name
    spec = _SPEC[name]
    tol = spec.get(tensor) or (spec.get("grad", spec["o"]) if tensor in GRADS else spec["o"])
    over = overrides().get(name, {})
    layers = [{k: v for k, v in over.items() if k not in TENSORS and k != "grad"}]
    if tensor in GRADS:
        layers.append(over.get("grad", {}))
    layers.append(over.get(tensor, {}))
    for layer in layers:
        if layer:
            tol = dataclasses.replace(tol, **layer, source=f"{ENV} ({name}.{tensor})")
    return tol


def mean_bound(tol: Tolerance, precision: Precision, ref_absmean: float) -> float:
    """Mean-abs bound of `tol`: `mean_abs`, raised to the output-rounding floor if larger."""
    return max(tol.mean_abs, tol.mean_floor_eps * precision.eps * ref_absmean)


def bound(tol: Tolerance, precision: Precision, ref_absmax: float, plain_err: Optional[float]) -> float:
    """Max-abs bound of `tol`: absolute, or factor x plain low-precision error + noise floor."""
    if not tol.relative:
        return tol.max_abs
    if plain_err is None:
        raise ValueError("plain_err: a relative tolerance needs the error of a plain low-precision run")
    return tol.factor * plain_err + tol.floor_eps * precision.eps * ref_absmax
