"""The conformance families (one pytest marker and one test module each) and how a test
result is assigned to one."""

from __future__ import annotations

FAMILIES = (
    "parity",
    "backward",
    "gradcheck",
    "determinism",
    "empty_ranges",
    "bounds",
    "dtype",
    "decode",
    "group",
    "varlen",
    "policy",
    "bad_input",
)
HARNESS = "harness"  # the harness's own unit tests (tests/)
OTHER = "other"


def family_of(nodeid: str, markers=()) -> str:
    """The family marker on the test, else the one its module is named after
    (`conformance/test_varlen.py` -> varlen; needed for xdist's crash reports, which carry
    no markers), else `harness` for tests/ and `other` for anything else."""
    for name in markers:
        if name in FAMILIES:
            return name
    module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py").removeprefix("test_")
    if module in FAMILIES:
        return module
    return HARNESS if nodeid.startswith("tests/") else OTHER
