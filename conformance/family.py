"""What a conformance family is: one declaration (in the style of PyTorch's OpInfo and
scikit-learn's `check_estimator`) from which everything else follows. A family names its
check, the cases it takes, and what it requires of an implementation as predicates over the
declarations (`Requirement`). Its pytest marker, test functions and parametrization, its skip
reasons, whether a `selgate check` claims it, the report's rows and the gate's family lists
are all derived from the declaration (see `selgate.conformance.families`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Optional

import pytest
import torch

from .cases import Case
from .impl import Impl, fit, known_bug, skip_reason


@dataclass(frozen=True)
class Requirement:
    """What a family needs an implementation to declare; `unmet` says, after its name, why
    it does not run (a skip reason) and why the family is not claimed."""

    holds: Callable[[Impl], bool]
    unmet: str


BACKWARD = Requirement(lambda i: i.backward, "does not declare backward (backward: false)")
DETERMINISTIC = Requirement(lambda i: i.deterministic, "declares itself non-deterministic (deterministic: false)")
FP64 = Requirement(lambda i: "fp64" in i.dtypes, "does not declare fp64 (gradcheck runs in fp64)")
VARLEN = Requirement(lambda i: i.varlen is not None and "varlen" in i.modes, "declares no varlen callable")
DECODE_AND_PREFILL = Requirement(lambda i: {"decode", "prefill"} <= set(i.modes), "does not declare modes decode and prefill")


@dataclass(frozen=True)
class Family:
    """One conformance family.

    - `name`: its test is `test_<name>`; `marker` (default: the name) is the pytest marker and
      the report row it counts in (determinism_backward counts as determinism).
    - `what`: the marker's help text. `rank`: the order of the report's rows.
    - `check(impl, case, device)`: raises `ConformanceFailure`; `applies(case)`: the cases it takes.
    - `requires`: declarations an implementation needs; `call_modes`: the modes its calls use
      when not the case's own (the decode family calls decode on prefill cases).
    - `claimed`: False for a family of selgate's own dispatcher (policy), never required of a
      kernel under `selgate check`.
    - `tests`: its pytest functions (and fixtures) when not the one generated over (impl, case);
      `parametrize(family, impls, cases, device)`: their (impl, ...) parameters when not the
      (impl x case) matrix.
    """

    name: str
    what: str
    rank: int
    check: Optional[Callable] = None
    applies: Callable[[Case], bool] = lambda c: True
    requires: tuple = ()
    call_modes: Optional[tuple] = None
    marker: str = ""
    claimed: bool = True
    tests: tuple = ()
    parametrize: Optional[Callable] = None

    @property
    def reported_as(self) -> str:
        return self.marker or self.name

    def unmet(self, impl: Impl) -> Optional[str]:
        """Why `impl` cannot take part in this family at all (without its name), or None."""
        if self.name in impl.unsupported:
            return f"does not take part in {self.name}: {impl.unsupported[self.name]}"
        return next((r.unmet for r in self.requires if not r.holds(impl)), None)

    def skip(self, impl: Impl, case: Optional[Case], device) -> Optional[str]:
        """Why `impl` does not run `case` (None: any case) in this family on `device`, or None."""
        why = impl.unavailable()
        if why:
            return f"{impl.name} unavailable: {why}"
        why = self.unmet(impl)
        if why:
            return f"{impl.name} {why}"
        return None if case is None else skip_reason(impl, case, device, modes=self.call_modes)

    @cached_property
    def test_functions(self) -> dict:
        """{name: function} the conformance test module exposes for this family (made and
        marked once: `conformance` and the family's marker)."""
        funcs = self.tests or (_matrix_test(self),)
        marks = (pytest.mark.conformance, getattr(pytest.mark, self.reported_as))
        out = {}
        for f in funcs:
            if f.__name__.startswith("test_"):
                for mark in marks:
                    f = mark(f)
            out[f.__name__] = f
        return out

    def params(self, impls, cases, device) -> tuple:
        """(argnames, pytest params) of this family's test over `impls` and `cases`."""
        return (self.parametrize or matrix)(self, impls, cases, device)


def _matrix_test(family: Family):
    def test(impl, case, device):
        family.check(impl, case, device)

    test.__name__ = test.__qualname__ = f"test_{family.name}"
    test.__doc__ = family.check.__doc__
    return test


def param_marks(why: Optional[str], bug: Optional[str]) -> list:
    """A declared skip, a declared known bug (strict xfail), or nothing."""
    if why:
        return [pytest.mark.skip(reason=why)]
    return [pytest.mark.xfail(strict=True, reason=bug)] if bug else []


def matrix(family: Family, impls, cases, device) -> tuple:
    """(impl x case): every case the family takes, fitted to what the implementation declares
    (heads per group, block size); an undeclared combination is a skip with its reason."""
    params = []
    for impl in impls:
        for base in cases:
            if not family.applies(base):
                continue
            case = fit(base, impl)
            why = family.skip(impl, case, device)
            bug = None if why else known_bug(impl, family.name, case)
            params.append(pytest.param(impl, case, id=f"{impl.name}-{case.id}", marks=param_marks(why, bug)))
    return ("impl", "case"), params


# --- the cases families take ------------------------------------------------------------------


def batched_lowp(c: Case) -> bool:
    """Batched (not packed) cases, not the fp64 gradcheck ones, not the GPU contention ones."""
    return c.mode != "varlen" and c.dtype != torch.float64 and not c.gpu_only


def repeatable(c: Case) -> bool:
    """The determinism families' cases, the contention cases included (their reason to exist)."""
    return c.mode != "varlen" and c.dtype != torch.float64 and c.pattern in ("mixed", "builder", "heavy_reuse", "full")


def tiny_subset(patterns, fp32_only=False):
    """On tiny (CPU) cases, only `patterns` (and fp32 when `fp32_only`); every case otherwise.
    Keeps the CPU run short for the families that run backward several times."""
    return lambda c: (
        batched_lowp(c)
        and (c.size != "tiny" or (c.pattern in patterns and c.scale is None and (c.dtype == torch.float32 or not fp32_only)))
    )
