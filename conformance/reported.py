"""The report's families, read from the conformance family declarations
(selgate.conformance.families), and which one a test result counts in."""

from __future__ import annotations

MODULE = "test_conformance.py"  # the module holding every family's tests
HARNESS = "harness"  # the harness's own unit tests (tests/)
OTHER = "other"


def names() -> tuple:
    """The report families (pytest markers), in the declarations' rank order. Imported when
    asked: the declarations bring torch and the kernels, which reading a lane YAML does not need."""
    from selgate.conformance import families

    return tuple(families.reported())


def family_of(nodeid: str, markers=()) -> str:
    """The family marker on the test, else the family whose test function it is
    (`...::test_determinism_backward[...]` -> determinism; needed for xdist's crash reports,
    which carry no markers), else `harness` for tests/ and `other` for anything else. A test
    outside the matrix with no markers is placed without loading the declarations (torch)."""
    module, _, test = nodeid.partition("::")
    in_matrix = module.endswith(MODULE)
    if markers or in_matrix:
        known = names()
        for name in markers:
            if name in known:
                return name
    if in_matrix:
        from selgate.conformance import families

        family = families.of_test(test.split("[", 1)[0])
        if family is not None:
            return family.reported_as
    return HARNESS if nodeid.startswith("tests/") else OTHER
