"""Comparison against the fp64 golden result, with failure messages a kernel author can act
on: case id, tensor, max and mean error, the bound and where it came from, the worst element."""

from __future__ import annotations

from typing import Optional, Union

import torch

from .tolerances import Precision, as_precision, bound, mean_bound, tolerance


class ConformanceFailure(AssertionError):
    """An implementation broke the contract (as opposed to the harness or the impl crashing)."""


def _where(t: torch.Tensor, flat_index: int) -> tuple:
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat_index), t.shape))


def fail(case_id: str, msg: str):
    raise ConformanceFailure(f"[{case_id}] {msg}")


def assert_close(
    name: str,
    actual: torch.Tensor,
    ref: torch.Tensor,
    *,
    precision: Union[Precision, torch.dtype],
    case_id: str,
    plain: Optional[torch.Tensor] = None,
) -> None:
    """`actual` matches the fp64 `ref` within the SPEC.md bound for an implementation judged in
    `precision` (a dtype: its IEEE arithmetic). `plain` is the plain PyTorch result in that
    precision the fp16/bf16/tf32 bound scales with. Non-finite reference entries (lse = -inf
    of empty rows) must be matched exactly; NaN or inf where the reference is finite always fails."""
    precision = as_precision(precision)
    if tuple(actual.shape) != tuple(ref.shape):
        fail(case_id, f"{name}: shape {tuple(actual.shape)}, expected {tuple(ref.shape)}")
    a, r = actual.detach().to(torch.float64), ref.detach().to(torch.float64)
    finite = torch.isfinite(r)
    wrong_special = ~finite & ~((a == r) | (torch.isnan(a) & torch.isnan(r)))
    bad = (finite & ~torch.isfinite(a)) | wrong_special
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        idx = _where(a, i)
        fail(
            case_id,
            f"{name}: {int(bad.sum())} non-finite or wrong special values, first at index {idx}: "
            f"got {a.flatten()[i].item()}, reference {r.flatten()[i].item()}",
        )
    if not finite.any():
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
        fail(
            case_id,
            f"{name}: max abs err {float(mx):.3e} (bound {lim:.3e}: {how}; {tol.source}), "
            f"mean abs err {float(mean):.3e} (bound {mean_lim:.3e}); worst at index {idx}: "
            f"got {a.flatten()[int(i)].item():.8g}, reference {r.flatten()[int(i)].item():.8g}",
        )


def assert_equal(name: str, actual: torch.Tensor, expected: torch.Tensor, *, case_id: str, why: str, atol: float = 0.0) -> None:
    """Bitwise equality (NaN equal to NaN), or within `atol` where the same arithmetic may
    legitimately reduce in another order; the message names the first differing element."""
    if tuple(actual.shape) != tuple(expected.shape):
        fail(case_id, f"{name}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)} ({why})")
    same = (actual == expected) | (torch.isnan(actual) & torch.isnan(expected))
    if atol:
        same |= (actual - expected).abs() <= atol
    if not bool(same.all()):
        i = int((~same).flatten().nonzero()[0])
        fail(
            case_id,
            f"{name}: {int((~same).sum())} elements differ ({why}); first at index {_where(actual, i)}: "
            f"{actual.flatten()[i].item()!r} vs {expected.flatten()[i].item()!r}",
        )
