"""Family determinism_backward, reported under determinism: repeated forward and backward
runs give bitwise-identical o, lse, dq, dk, dv."""

from __future__ import annotations

from ..cases import Case
from ..family import BACKWARD, DETERMINISTIC, Family, repeatable
from ..impl import Impl
from . import determinism


def check(impl: Impl, case: Case, device) -> None:
    """Repeated forward and backward runs give bitwise-identical o, lse, dq, dk, dv."""
    determinism.check(impl, case, device, backward=True)


FAMILY = Family(
    "determinism_backward",
    "bitwise-identical repeated forward and backward runs",
    rank=4,
    check=check,
    applies=repeatable,
    requires=(DETERMINISTIC, BACKWARD),
    marker="determinism",
)
