"""The conformance families: each module of this package declares one (`FAMILY`), and every
list of families is read from here: pytest markers and test functions
(conformance/test_conformance.py), skip reasons, what a `selgate check` claims, the report's
rows, the gate's family names and `--declare` validation. Adding a family is adding a module;
`register` adds one from elsewhere (a plugin, a test).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Optional

from ..family import Family

FAMILIES: dict = {}  # name -> Family, in rank order


def register(family: Family) -> Family:
    """Adds `family` (replacing one of the same name) and keeps FAMILIES in rank order."""
    items = {**FAMILIES, family.name: family}
    FAMILIES.clear()
    FAMILIES.update(sorted(items.items(), key=lambda kv: (kv[1].rank, kv[0])))
    return family


def reported() -> dict:
    """{report family (marker): its help text}, in rank order: the report's rows, the markers."""
    out = {}
    for f in FAMILIES.values():
        out.setdefault(f.reported_as, f.what)
    return out


def of_test(test_name: str) -> Optional[Family]:
    """The family of the test function `test_name` (`test_parity` -> parity), or None."""
    for f in FAMILIES.values():
        if test_name in f.test_functions:
            return f
    return None


def claims(impl) -> dict:
    """{report family: None when `impl` claims it, else why not}: the families a passing
    `selgate check` requires. A report family is claimed when one of its families' requirements
    all hold; policy (selgate's own dispatcher) is never claimed."""
    out: dict = {}
    for f in FAMILIES.values():
        if f.claimed:
            why = f.unmet(impl)
            out[f.reported_as] = None if why is None or out.get(f.reported_as, "") is None else why
    return out


def all_tests() -> dict:
    """Every family's test functions (and fixtures), by name."""
    out = {}
    for f in FAMILIES.values():
        out.update(f.test_functions)
    return out


for _module in pkgutil.iter_modules(__path__):
    register(importlib.import_module(f"{__name__}.{_module.name}").FAMILY)
