"""The case a reproducer reruns, found as the matrix made it (`triage` writes the reproducers;
this module, which imports the matrix and torch, runs where they run)."""

from __future__ import annotations

from selgate.conformance.cases import Case, select
from selgate.conformance.impl import Impl, fit


def find_case(impl: Impl, case_id: str, size: str) -> Case:
    """The matrix's case `case_id` as its nodeid shows it: fitted to `impl`."""
    for base in select(size):
        case = fit(base, impl)
        if case.id == case_id:
            return case
    raise LookupError(f"no case {case_id} among the {size} cases fitted to {impl.name}")


def find_param(impl: Impl, family: str, param_id: str) -> tuple:
    """The parameters after the implementation of `family`'s test `param_id` (bad_input's
    (BadInput, Case), limits' (limit, Case)), as the matrix makes them."""
    from selgate.conformance.families import FAMILIES
    from selgate.conformance.plugin import run_device

    for param in FAMILIES[family].params([impl], select("tiny"), run_device())[1]:
        if param.id == param_id:
            return param.values[1:]
    raise LookupError(f"no {family} test {param_id} for {impl.name}")
