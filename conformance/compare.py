"""Comparison against the fp64 golden result, with failure messages a kernel author can act
on: case id, tensor, max and mean error, the bound and where it came from, the worst element."""

from __future__ import annotations

import math
from typing import Optional, Union

import torch

from .rules import RULES
from .tolerances import Precision, as_precision, bound, mean_bound, tolerance


class ConformanceFailure(AssertionError):
    """An implementation broke the contract (as opposed to the harness or the impl crashing).
    `facts` says how, as data written once here: the SPEC.md rule (a key of RULES), the tensor,
    the kind of failure (free of anything that belongs to the case) and, for an error over its
    bound, the error and the bound. The report groups failures by (rule, tensor, kind)."""

    def __init__(self, message: str, *, rule: str, kind: str, tensor: str | None = None, error=None, bound=None):
        super().__init__(message)
        if rule not in RULES:
            raise ValueError(f"rule {rule!r}: not one of {list(RULES)}")
        facts = {"rule": rule, "tensor": tensor, "kind": kind, "error": error, "bound": bound}
        self.facts = {k: v for k, v in facts.items() if v is not None}


def _where(t: torch.Tensor, flat_index: int) -> tuple:
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat_index), t.shape))


def fail(case_id: str, msg: str, **facts):
    """ConformanceFailure `[case_id] msg` with its `facts` (rule, kind, tensor, error, bound)."""
    raise ConformanceFailure(f"[{case_id}] {msg}", **facts)


def special(x: float) -> str:
    """What a value is, for a kind of failure: NaN, Inf, -Inf or finite."""
    if math.isnan(x):
        return "NaN"
    return ("-Inf" if x < 0 else "Inf") if math.isinf(x) else "finite"


def value_kind(x: float) -> str:
    """As `special`, with exact zero told apart (empty rows and unread keys must give 0)."""
    kind = special(x)
    return ("0" if x == 0 else "non-zero") if kind == "finite" else kind


DIMS = {"o": "B S G h Dv", "lse": "B S G h", "dq": "B S G h Dk", "dk": "B G S_kv Dk", "dv": "B G S_kv Dv"}


def shape_kind(name: str, got: tuple, want: tuple) -> str:
    """Which dimensions differ, by name (SPEC.md layout): the sizes themselves belong to the case."""
    if len(got) != len(want):
        return f"{len(got)} dims, expected {len(want)}"
    names = DIMS.get(_tensor(name), "").split()
    dims = [names[i] if len(names) == len(want) else f"dim {i}" for i in range(len(want)) if got[i] != want[i]]
    return f"shape differs in {', '.join(dims)}" if dims else "shape differs"


def _tensor(name: str) -> str:
    """The tensor a compared name is part of: `dk[tail keys]` is dk (the part is the case's)."""
    return name.split("[")[0]


def _empty_rows(name: str, got: float, want: float):
    """(rule, kind) when `name` is o or dq, non-finite where it must be exactly 0, or lse other
    than -inf where it must be -inf: only a row that selects nothing has those (its own rows,
    the family's empty ones, the bounds family's tail queries), however a family words it."""
    base = _tensor(name)
    if base in ("o", "dq") and special(got) != "finite" and want == 0.0:
        return "empty-rows", f"{special(got)} on rows that select nothing (where {base} is exactly 0)"
    if base == "lse" and want == -math.inf and got != want:
        return "empty-rows", f"{value_kind(got)} on rows that select nothing (where lse is -Inf)"
    return None


def _same_shape(name: str, actual: torch.Tensor, expected: torch.Tensor, case_id: str, why: str = "") -> None:
    """A shape failure naming the dimensions that differ, before any value is compared."""
    got, want = tuple(actual.shape), tuple(expected.shape)
    if got != want:
        kind = shape_kind(name, got, want)
        fail(case_id, f"{name}: shape {got}, expected {want}{why}", rule="shapes", tensor=_tensor(name), kind=kind)


def assert_close(
    name: str,
    actual: torch.Tensor,
    ref: torch.Tensor,
    *,
    precision: Union[Precision, torch.dtype],
    case_id: str,
    plain: Optional[torch.Tensor] = None,
    values: bool = True,
) -> None:
    """`actual` matches the fp64 `ref` within the SPEC.md bound for an implementation judged in
    `precision` (a dtype: its IEEE arithmetic). `plain` is the plain PyTorch result in that
    precision the fp16/bf16/tf32 bound scales with. Non-finite reference entries (lse = -inf
    of empty rows) must be matched exactly; NaN or inf where the reference is finite always fails.
    `values` False: that alone is judged (the finite values are not)."""
    precision = as_precision(precision)
    _same_shape(name, actual, ref, case_id)
    a, r = actual.detach().to(torch.float64), ref.detach().to(torch.float64)
    finite = torch.isfinite(r)
    wrong_special = ~finite & ~((a == r) | (torch.isnan(a) & torch.isnan(r)))
    bad = (finite & ~torch.isfinite(a)) | wrong_special
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        idx = _where(a, i)
        got, want = a.flatten()[i].item(), r.flatten()[i].item()
        rule, kind = _empty_rows(name, got, want) or ("finite", f"{special(got)} where the reference is {special(want)}")
        fail(
            case_id,
            f"{name}: {int(bad.sum())} non-finite or wrong special values, first at index {idx}: got {got}, reference {want}",
            rule=rule,
            tensor=_tensor(name),
            kind=kind,
        )
    if not finite.any() or not values:
        return
    err = torch.where(finite, (a - r).abs(), 0.0)
    mx, i = err.flatten().max(0)
    mean = err.sum() / finite.sum()
    tol = tolerance(precision, name)
    plain_err = None
    if tol.relative:
        p = plain.detach().to(torch.float64)
        plain_err = float(torch.where(finite, (p - r).abs(), 0.0).max())
    ref_abs = torch.where(finite, r.abs(), 0.0)
    lim = bound(tol, precision, float(ref_abs.max()), plain_err)
    mean_lim = mean_bound(tol, precision, float(ref_abs.sum() / finite.sum()))
    if mx > lim or mean > mean_lim:
        idx = _where(a, int(i))
        how = (
            f"{tol.factor:g} x plain-{precision.name} error {plain_err:.3e} + {tol.floor_eps:g} eps max|ref|"
            if tol.relative
            else "absolute"
        )
        over_max = mx > lim
        fail(
            case_id,
            f"{name}: max abs err {float(mx):.3e} (bound {lim:.3e}: {how}; {tol.source}), "
            f"mean abs err {float(mean):.3e} (bound {mean_lim:.3e}); worst at index {idx}: "
            f"got {a.flatten()[int(i)].item():.8g}, reference {r.flatten()[int(i)].item():.8g}",
            rule="accuracy",
            tensor=_tensor(name),
            kind="max abs err over its bound" if over_max else "mean abs err over its bound",
            error=float(mx) if over_max else float(mean),
            bound=lim if over_max else mean_lim,
        )


def bits(t: torch.Tensor) -> torch.Tensor:
    """`t`'s elements as integers of the same width: NaN payloads and -0.0 compare as stored."""
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}
    return t.view(ints[t.element_size()]) if t.is_floating_point() else t


def assert_equal(
    name: str, actual: torch.Tensor, expected: torch.Tensor, *, case_id: str, why: str, rule: str, atol: float = 0.0
) -> None:
    """Bitwise equality of what is stored (-0.0 is not 0.0, nor one NaN payload another; values
    of two dtypes compare by value, NaN equal to NaN), or within `atol` where the same arithmetic
    may legitimately reduce in another order, as SPEC.md's `rule` asks; the message names the
    first differing element."""
    _same_shape(name, actual, expected, case_id, f" ({why})")
    if actual.dtype == expected.dtype:
        same = bits(actual) == bits(expected)
    else:
        same = (actual == expected) | (torch.isnan(actual) & torch.isnan(expected))
    if atol:
        same |= (actual - expected).abs() <= atol
    if not bool(same.all()):
        i = int((~same).flatten().nonzero()[0])
        got, want = float(actual.flatten()[i].item()), float(expected.flatten()[i].item())
        if rule == "determinism":
            kind = f"not bitwise identical across {'processes' if 'across processes' in why else 'runs'}"
        elif value_kind(got) == value_kind(want):
            kind = f"differs ({why})"
        else:
            rule, kind = _empty_rows(name, got, want) or (rule, f"{value_kind(got)} where {value_kind(want)} is expected")
        fail(
            case_id,
            f"{name}: {int((~same).sum())} elements differ ({why}); first at index {_where(actual, i)}: "
            f"{actual.flatten()[i].item()!r} vs {expected.flatten()[i].item()!r}",
            rule=rule,
            tensor=_tensor(name),
            kind=kind,
        )
